// The scenarios under Node's test runner, against the broker VEIL_URL names (VEIL_WS_URL: its
// WebSocket delivery port). Node 20 needs --experimental-websocket (`npm test` passes it).
import { test } from "node:test";

import * as veil from "../dist/index.js";
import { scenarios } from "./scenarios.js";

const broker = { url: process.env.VEIL_URL, wsUrl: process.env.VEIL_WS_URL };

for (const [name, scenario] of Object.entries(scenarios)) {
  test(name, { skip: broker.url ? false : "VEIL_URL names no broker" }, () => scenario(veil, broker));
}

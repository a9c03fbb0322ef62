/**
 * The Veil client: publish, subscribe and unsubscribe over REST (fetch), deliveries over WebSocket
 * (`deliveries`, `multiplexed`). It needs nothing beyond the platform's fetch and WebSocket: a
 * browser's, or Node's (Node 22 and later have both; Node 20 has WebSocket behind
 * `--experimental-websocket`, or pass any WHATWG-compatible implementation as `WebSocket`).
 */

import { DeliveryStream, type StreamOptions } from "./deliveries.js";
import { Overloaded, VeilError, errorFromBody } from "./errors.js";

export type WebSocketConstructor = new (url: string) => WebSocket;

export interface ClientOptions {
  /** The broker's REST address, e.g. "http://localhost:20000" (https when it has TLS). */
  url: string;
  /** A SELIS authHash: the identity it stands for in the broker's registry. */
  authHash?: string;
  /** A bearer token (JWT) from the identity provider the broker trusts, instead of an authHash. */
  token?: string;
  /** Where delivery connections go (default: the WebSocket port /subscribe names, else the REST port + 2). */
  wsUrl?: string;
  fetch?: typeof fetch;
  WebSocket?: WebSocketConstructor;
  /** Milliseconds a publish is sent again while no answer comes or the broker is overloaded (default 30000). */
  publishRetryMs?: number;
  /** Milliseconds one request may take (default 30000). */
  timeoutMs?: number;
}

export interface PublishOptions {
  /** Names the publication: the broker logs it once however often it is sent (default: a random key). */
  idempotencyKey?: string;
  /** Milliseconds the publication stays valid: subscriptions made meanwhile receive it too. */
  validForMs?: number;
  /** This publish's `publishRetryMs` (0: sent once). */
  retryForMs?: number;
}

export interface SubscribeOptions {
  /** Your id for it (reusing one of yours replaces that subscription); default: the broker makes one. */
  subscriptionId?: string;
  /** A top-k subscription: {"k": K, "w": MILLISECONDS or "n": COUNT, "score": [TERM, ...]}. */
  topk?: Record<string, unknown>;
  /** The scope it is made in (default: the world). */
  scope?: string;
  /** Receive first what it matches of the publications the broker retains that were logged since then. */
  since?: Date | number;
  /** Bounds on its queue below the broker's: {"deliveries": N, "bytes": N, "age": MILLISECONDS}. */
  limits?: { deliveries?: number; bytes?: number; age?: number };
  /** The broker POSTs its deliveries there instead: {"url": "https://...", "batch": N}. */
  webhook?: { url: string; batch?: number };
}

export interface SubscribeReply {
  subscriptionId: string;
  host?: string;
  port?: number;
  "ws-port"?: number;
  /** A webhook subscription's secret, which signs its requests: shown this once. */
  webhookSecret?: string;
}

/** A SELIS constraint: {"key": "berth", "op": "ge", "val": 3} (op: eq, ne, gt, lt, ge, le, between, in, ...). */
export type Constraint = { key: string; op: string; val: unknown; type?: string };

const RETRY_FIRST_MS = 100;
const RETRY_MOST_MS = 2000;

export class VeilClient {
  readonly url: string;
  readonly authHash: string | undefined;
  readonly token: string | undefined;
  /** Per subscription, the seq of the last delivery consumed: where its next stream resumes. */
  readonly positions = new Map<string, number>();
  wsUrl: string;
  private readonly wsUrlGiven: boolean;
  readonly WebSocket: WebSocketConstructor | undefined;
  private readonly fetcher: typeof fetch;
  private readonly publishRetryMs: number;
  private readonly timeoutMs: number;

  constructor(options: ClientOptions) {
    const url = new URL(options.url);
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`url: an http or https address, not ${options.url}`);
    }
    this.url = url.origin;
    this.authHash = options.authHash;
    this.token = options.token;
    const restPort = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    this.wsUrl = options.wsUrl ?? webSocketUrl(url, restPort + 2);
    this.wsUrlGiven = options.wsUrl !== undefined;
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.WebSocket = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    this.publishRetryMs = options.publishRetryMs ?? 30000;
    this.timeoutMs = options.timeoutMs ?? 30000;
  }

  private headers(contentType: string): Record<string, string> {
    const headers: Record<string, string> = { "Content-Type": contentType };
    if (this.authHash !== undefined) headers["X-Auth-Hash"] = this.authHash;
    if (this.token !== undefined) headers["Authorization"] = `Bearer ${this.token}`;
    return headers;
  }

  /** One REST request; its JSON answer, or the broker's refusal as a `VeilError` of its kind. */
  async request(
    path: string,
    body?: string,
    options: { method?: string; contentType?: string; headers?: Record<string, string> } = {},
  ): Promise<unknown> {
    const response = await this.fetcher(`${this.url}${path}`, {
      method: options.method ?? "POST",
      headers: { ...this.headers(options.contentType ?? "application/json"), ...options.headers },
      body,
      redirect: "error",
      signal: AbortSignal.timeout(this.timeoutMs),
    });
    const text = await response.text();
    if (response.status !== 200) {
      const error = errorFromBody(response.status, text);
      const after = response.headers.get("Retry-After");
      if (error instanceof Overloaded && after !== null && /^[0-9]{1,6}$/.test(after)) {
        error.retryAfter = Number(after);
      }
      throw error;
    }
    return text ? JSON.parse(text) : null;
  }

  /** Publish one publication (an object, or its JSON text sent as it is); returns its id. */
  async publish(publication: object | string, options: PublishOptions = {}): Promise<string> {
    const body = typeof publication === "string" ? publication : JSON.stringify(publication);
    const answer = (await this.published(body, "application/json", options)) as { id: string };
    return answer.id;
  }

  /** Publish many in one request (NDJSON), logged in their order; returns their ids. */
  async publishBatch(publications: object[], options: PublishOptions = {}): Promise<string[]> {
    const body = publications.map((p) => JSON.stringify(p)).join("\n") + "\n";
    const answer = (await this.published(body, "application/x-ndjson", options)) as { ids: string[] };
    return answer.ids;
  }

  /**
   * A publish, sent again under its idempotency key while no answer came or the broker was
   * overloaded, backing off with jitter (or as long as the broker asked), for up to `retryForMs`
   * after the first attempt: the broker logs it once however often it arrives.
   */
  private async published(body: string, contentType: string, options: PublishOptions): Promise<unknown> {
    const headers: Record<string, string> = { "Idempotency-Key": options.idempotencyKey ?? randomKey() };
    if (options.validForMs !== undefined) headers["X-Valid-For"] = String(options.validForMs);
    const deadline = Date.now() + (options.retryForMs ?? this.publishRetryMs);
    let wait = RETRY_FIRST_MS;
    for (;;) {
      try {
        return await this.request("/publish", body, { contentType, headers });
      } catch (error) {
        if (error instanceof VeilError && !(error instanceof Overloaded)) throw error;
        let pause = wait * (0.5 + Math.random() / 2);
        if (error instanceof Overloaded && error.retryAfter !== null) pause = Math.max(pause, error.retryAfter * 1000);
        if (Date.now() + pause > deadline) throw error;
        await sleep(pause);
        wait = Math.min(2 * wait, RETRY_MOST_MS);
      }
    }
  }

  /** Subscribe (or replace a subscription of yours) with these constraints, all of which must hold. */
  async subscribe(data: Constraint[], options: SubscribeOptions = {}): Promise<SubscribeReply> {
    const doc: Record<string, unknown> = { data };
    if (options.subscriptionId !== undefined) doc["subscriptionId"] = options.subscriptionId;
    if (options.topk !== undefined) doc["topk"] = options.topk;
    if (options.scope !== undefined) doc["scope"] = options.scope;
    if (options.since !== undefined) {
      doc["since"] = options.since instanceof Date ? options.since.getTime() : options.since;
    }
    if (options.limits !== undefined) doc["limits"] = options.limits;
    if (options.webhook !== undefined) doc["webhook"] = options.webhook;
    if (this.authHash !== undefined) doc["authHash"] = this.authHash;
    const reply = (await this.request("/subscribe", JSON.stringify(doc))) as SubscribeReply;
    const port = reply["ws-port"];
    if (!this.wsUrlGiven && typeof port === "number" && port > 0) this.wsUrl = webSocketUrl(new URL(this.url), port);
    return reply;
  }

  async unsubscribe(subscriptionId: string): Promise<void> {
    const doc: Record<string, unknown> = { subscriptionId };
    if (this.authHash !== undefined) doc["authHash"] = this.authHash;
    await this.request("/unsubscribe", JSON.stringify(doc));
  }

  /** Your live subscriptions as /subscribe took them (id, data, scope, topk, created), in id order. */
  async subscriptions(): Promise<Record<string, unknown>[]> {
    const listed: Record<string, unknown>[] = [];
    let after = "";
    for (;;) {
      const page = (await this.request(`/subscriptions?after=${encodeURIComponent(after)}`, undefined, {
        method: "GET",
      })) as { subscriptions: Record<string, unknown>[]; next: string | null };
      listed.push(...page.subscriptions);
      if (page.next === null) return listed;
      after = page.next;
    }
  }

  /**
   * The subscription's deliveries, as an async iterable: each in an envelope (seq, id, publisher),
   * acknowledged once the next one is asked for (so a delivery is consumed only after the code
   * that took it is done with it), resumed after the last one consumed when the connection drops.
   */
  deliveries(subscriptionId: string, options: StreamOptions = {}): DeliveryStream {
    return new DeliveryStream(this, [subscriptionId], false, options);
  }

  /** Many subscriptions' deliveries over one connection, each naming the subscriptions it is for. */
  multiplexed(subscriptionIds: string[], options: StreamOptions = {}): DeliveryStream {
    return new DeliveryStream(this, [...new Set(subscriptionIds)], true, options);
  }
}

function webSocketUrl(rest: URL, port: number): string {
  // (an IPv6 host name keeps its brackets in URL.hostname)
  return `${rest.protocol === "https:" ? "wss" : "ws"}://${rest.hostname}:${port}/`;
}

function randomKey(): string {
  // (getRandomValues, unlike randomUUID, is there in pages served over plain http too)
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

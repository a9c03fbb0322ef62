/**
 * A subscription's deliveries (or many subscriptions', multiplexed) over a WebSocket delivery
 * connection: the handshake, envelopes, acknowledgements, and resuming after a dropped connection.
 *
 * A delivery counts as consumed once the next one is asked for: `for await (const d of stream) {
 * await handle(d) }` acknowledges `d` only after `handle` is done with it; leaving the loop (a
 * `break`, or `handle` throwing) acknowledges nothing more, so the delivery in hand comes again to
 * the next stream (`stream.consumed()` first, before a `break`, counts it consumed). Consumed
 * deliveries are acknowledged to the broker in groups (every ACK_EVERY, when nothing more waits, or
 * ACK_AFTER_MS after the last acknowledgement). A connection that drops is opened again, resuming
 * after the last delivery consumed (`resumeAfter`): what was received and not yet handed over comes
 * again, and what the broker sends again at or below what was handed over is dropped
 * (`droppedDuplicates`). At most BUFFER_MOST deliveries wait to be handed over: past that the
 * connection is closed, and opened again once the application has taken them all (a browser
 * reads its sockets whatever the page does, so the broker cannot see a slow reader). Errors the
 * broker sends end the stream as typed errors when reconnecting would only be refused again
 * (`FATAL`); others (the broker overloaded or restarting) are waited out, backing off with jitter.
 */

import type { VeilClient } from "./client.js";
import { BrokerFault, FATAL, VeilError, errorFromDocument } from "./errors.js";

export interface Delivery {
  /** Its place in the subscription's order: what acknowledgements and resumeAfter name. */
  seq: number;
  /** The publication's id (an original's, for a copy delivered later). */
  id: string;
  publication: unknown;
  /** Who published it, as the broker authenticated them (null where the broker names nobody). */
  publisher: string | null;
  /** The publisher's signature over the publication's bytes, when it signed them. */
  keyId: string | null;
  signature: string | null;
  /** The publication was cropped for this subscriber: some of its attributes were left out. */
  cropped: boolean;
  /** The subscriptions it is for (on a stream of one, that one). */
  subscriptionIds: string[];
}

export interface StreamOptions {
  /** Resume after this seq (default: after the last delivery this client consumed, else where the broker has it). */
  resumeAfter?: number;
}

const ACK_EVERY = 256;
const ACK_AFTER_MS = 1000;
const MAX_FAILURES = 60; // consecutive failed connections (or broker faults) before the stream gives up
const BUFFER_MOST = 8192; // deliveries received and not yet handed over, at most
const MAX_SEQ = Number.MAX_SAFE_INTEGER;

type Waiter = { resolve: (value: IteratorResult<Delivery>) => void; reject: (error: unknown) => void };

export class DeliveryStream implements AsyncIterableIterator<Delivery> {
  /** Connections opened again after one dropped. */
  reconnects = 0;
  /** Deliveries the broker sent again at or below the resume point, dropped. */
  droppedDuplicates = 0;
  /** Multiplexed: subscriptions the broker ended (removed, quarantined), with why. */
  readonly ended = new Map<string, VeilError>();
  /** The seq of the last delivery consumed. */
  lastSeq: number | null = null;

  private ids: string[];
  private readonly carried: Set<string>;
  private readonly initial = new Map<string, number>(); // per subscription, where the stream started
  private readonly consumedEach = new Map<string, number>(); // and the last seq consumed
  private received = new Map<string, number>(); // and the last seq queued (or handed over)
  private resume = new Map<string, number>(); // where the connection resumed
  private paused = false; // closed for a full buffer: opened again once it is drained
  private drained: (() => void) | null = null;
  private buffer: Delivery[] = [];
  private waiter: Waiter | null = null;
  private failure: unknown = null;
  private finished = false;
  private handed: Delivery | null = null;
  private ackable: number | null = null;
  private acked: number | null = null;
  private unacked = 0;
  private ackedAt = Date.now();
  private socket: WebSocket | null = null;
  private running: Promise<void> | null = null;
  private failures = 0;
  private wake: (() => void) | null = null;

  constructor(
    private readonly client: VeilClient,
    ids: string[],
    private readonly multiplexed: boolean,
    options: StreamOptions,
  ) {
    if (ids.length === 0) throw new TypeError("subscriptionIds: at least one");
    this.ids = ids;
    this.carried = new Set(ids);
    for (const id of ids) {
      const position = options.resumeAfter ?? client.positions.get(id);
      if (position !== undefined) this.initial.set(id, position);
    }
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Delivery>> {
    this.running ??= this.run();
    if (this.handed !== null) {
      this.settle(this.handed);
      this.handed = null;
    }
    if (this.buffer.length === 0 || this.unacked >= ACK_EVERY || Date.now() - this.ackedAt >= ACK_AFTER_MS) {
      this.acknowledge();
    }
    const delivery = this.buffer.shift();
    if (delivery !== undefined) {
      this.handed = delivery;
      if (this.buffer.length === 0) this.drained?.();
      return { value: delivery, done: false };
    }
    if (this.failure !== null) throw this.failure;
    if (this.finished) return { value: undefined, done: true };
    const result = await new Promise<IteratorResult<Delivery>>((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
    if (!result.done) this.handed = result.value;
    return result;
  }

  /** Close the stream (what a `for await` loop does when it is left). */
  async return(): Promise<IteratorResult<Delivery>> {
    await this.close();
    return { value: undefined, done: true };
  }

  /** The delivery in hand is done with: counted consumed now, not only when the next is asked for. */
  consumed(): void {
    if (this.handed !== null) {
      this.settle(this.handed);
      this.handed = null;
    }
  }

  /** Close the stream: what was consumed is acknowledged (not the delivery in hand), and the connection closed. */
  async close(): Promise<void> {
    this.acknowledge();
    this.handed = null;
    this.end(null);
    this.socket?.close();
    this.wake?.();
    this.drained?.();
    await this.running?.catch(() => undefined);
  }

  /** Drop the connection and open another, resuming after the last delivery consumed. */
  reconnect(): void {
    this.socket?.close();
  }

  private settle(delivery: Delivery): void {
    this.lastSeq = delivery.seq;
    for (const id of delivery.subscriptionIds) {
      this.consumedEach.set(id, delivery.seq);
      this.client.positions.set(id, delivery.seq);
    }
    this.ackable = delivery.seq;
    this.unacked += 1;
  }

  private acknowledge(): void {
    const socket = this.socket;
    if (this.ackable === null || this.ackable === this.acked || socket === null || socket.readyState !== 1) return;
    socket.send(JSON.stringify({ ack: this.ackable }));
    this.acked = this.ackable;
    this.unacked = 0;
    this.ackedAt = Date.now();
  }

  /** The stream ends: with `error`, or (null) because it was closed or no subscription is left. */
  private end(error: unknown): void {
    if (this.finished || this.failure !== null) return;
    if (error === null) this.finished = true;
    else this.failure = error;
    const waiter = this.waiter;
    this.waiter = null;
    if (waiter === null) return;
    if (error === null) waiter.resolve({ value: undefined, done: true });
    else waiter.reject(error);
  }

  private hand(delivery: Delivery): void {
    const waiter = this.waiter;
    if (waiter !== null) {
      this.waiter = null;
      waiter.resolve({ value: delivery, done: false });
      return;
    }
    this.buffer.push(delivery);
    if (this.buffer.length >= BUFFER_MOST && !this.paused) {
      this.paused = true;
      this.socket?.close();
    }
  }

  private async run(): Promise<void> {
    const WebSocketImpl = this.client.WebSocket;
    if (WebSocketImpl === undefined) {
      this.end(
        new TypeError(
          "no WebSocket in this runtime: Node 20 needs --experimental-websocket (22 has it), or pass options.WebSocket",
        ),
      );
      return;
    }
    let delay = 200;
    while (!this.finished && this.failure === null) {
      const opened = await this.connect(WebSocketImpl);
      if (this.finished || this.failure !== null) return;
      if (this.paused) {
        if (this.buffer.length > 0) await new Promise<void>((resolve) => (this.drained = resolve));
        this.drained = null;
        this.paused = false;
        continue; // (no failure: nothing is lost, the next connection resumes after what was handed over)
      }
      if (opened) {
        this.failures = 0;
      } else if (++this.failures > MAX_FAILURES) {
        this.end(new VeilError("", `no delivery connection to ${this.client.wsUrl} after ${MAX_FAILURES} attempts`, 0));
        return;
      }
      this.reconnects += 1;
      const pause = (this.failures ? delay : 50) * (0.5 + Math.random() / 2);
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        setTimeout(resolve, pause);
      });
      this.wake = null;
      delay = this.failures ? Math.min(delay * 2, 2000) : 200;
    }
  }

  /** One connection's life; whether it got as far as delivering (a drop after that is no failure). */
  private connect(WebSocketImpl: new (url: string) => WebSocket): Promise<boolean> {
    return new Promise((resolve) => {
      let socket: WebSocket;
      try {
        socket = new WebSocketImpl(this.client.wsUrl);
      } catch (error) {
        this.end(error);
        resolve(false);
        return;
      }
      this.socket = socket;
      let delivering = false;
      socket.onopen = () => {
        this.restart();
        socket.send(this.handshake());
      };
      socket.onmessage = (event: MessageEvent) => {
        try {
          if (typeof event.data !== "string") throw new BrokerFault("", "a binary message: not an envelope", 0);
          if (this.take(event.data)) delivering = true;
        } catch (error) {
          if (error instanceof BrokerFault) {
            delivering = false; // (counted as a failure: a broker that keeps sending junk is given up on)
          } else {
            this.end(error);
          }
          socket.close();
        }
      };
      socket.onclose = () => {
        if (this.socket === socket) this.socket = null;
        resolve(delivering);
      };
    });
  }

  /**
   * Before a new connection: it resumes after what was consumed; what was received and not handed
   * over comes again, and the delivery in hand (its handler may be at work on it), if it comes
   * again, is dropped.
   */
  private restart(): void {
    this.buffer = [];
    this.resume = new Map();
    for (const id of this.ids) {
      const position = this.consumedEach.get(id) ?? this.initial.get(id);
      if (position !== undefined) this.resume.set(id, position);
    }
    this.received = new Map(this.resume);
    for (const id of this.handed?.subscriptionIds ?? []) {
      this.received.set(id, Math.max(this.received.get(id) ?? -1, this.handed?.seq ?? -1));
    }
    this.ackable = this.acked = null;
    this.unacked = 0;
  }

  private handshake(): string {
    const doc: Record<string, unknown> = { envelope: true, ack: true };
    if (this.multiplexed) {
      doc["subscriptionIds"] = this.ids;
      if (this.ids.some((id) => this.resume.has(id))) doc["resumeAfter"] = this.ids.map((id) => this.resume.get(id) ?? null);
    } else {
      doc["subscriptionId"] = this.ids[0];
      const position = this.resume.get(this.ids[0] as string);
      if (position !== undefined) doc["resumeAfter"] = position;
    }
    if (this.client.authHash !== undefined) doc["authHash"] = this.client.authHash;
    if (this.client.token !== undefined) doc["token"] = this.client.token;
    return JSON.stringify(doc);
  }

  /** A message of the broker's; true when it was a delivery. */
  private take(text: string): boolean {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      throw new BrokerFault("", `unreadable message from the broker: ${text.slice(0, 200)}`, 0);
    }
    if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
      throw new BrokerFault("", `not an envelope: ${text.slice(0, 200)}`, 0);
    }
    const envelope = doc as Record<string, unknown>;
    if (!("seq" in envelope)) {
      const error = errorFromDocument(envelope);
      const ended = envelope["subscriptionId"];
      if (this.multiplexed && typeof ended === "string" && this.carried.has(ended)) {
        this.ended.set(ended, error);
        this.ids = this.ids.filter((id) => id !== ended);
        if (this.ids.length === 0) this.end(null);
        return false;
      }
      if (FATAL.some((kind) => error instanceof kind)) this.end(error);
      return false; // (otherwise the broker closes the connection, and the next one tries again)
    }
    const seq = envelope["seq"];
    if (typeof seq !== "number" || !Number.isInteger(seq) || seq < 0 || seq > MAX_SEQ) {
      throw new BrokerFault("seq", `not a sequence number: ${text.slice(0, 200)}`, 0);
    }
    const fresh = this.fresh(seq, envelope["subscriptionIds"]);
    if (fresh.length === 0) return false; // (a broker that resends only old ones makes no progress)
    this.hand(delivery(seq, envelope, fresh));
    return true;
  }

  /** Of the subscriptions a delivery is for, those it is new to (the others are counted, and dropped). */
  private fresh(seq: number, named: unknown): string[] {
    let ids: string[];
    if (!this.multiplexed) {
      ids = [this.ids[0] as string];
    } else if (
      Array.isArray(named) && named.length > 0 && new Set(named).size === named.length &&
      named.every((id) => typeof id === "string" && this.carried.has(id))
    ) {
      ids = named as string[];
    } else {
      throw new BrokerFault("subscriptionIds", `delivery ${seq} names subscriptions this connection does not carry`, 0);
    }
    const fresh = ids.filter((id) => (this.received.get(id) ?? -1) < seq);
    this.droppedDuplicates += ids.length - fresh.length;
    for (const id of fresh) this.received.set(id, seq);
    return fresh;
  }
}

function delivery(seq: number, doc: Record<string, unknown>, subscriptionIds: string[]): Delivery {
  const text = (name: string): string | null => (typeof doc[name] === "string" ? (doc[name] as string) : null);
  return {
    seq,
    id: text("id") ?? String(seq),
    publication: doc["publication"],
    publisher: text("publisher"),
    keyId: text("keyId"),
    signature: text("signature"),
    cropped: doc["cropped"] === true,
    subscriptionIds,
  };
}

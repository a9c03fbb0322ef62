// The client's tests, run against a real broker both by Node's test runner (node.test.js) and in a
// browser page (browser.html). Each scenario takes the client's module and where the broker is, and
// throws (an AssertionError-like Error) when the client does not behave.

const WAIT_MS = 60000; // for a delivery: the broker's pipeline matches in rounds

function check(condition, message) {
  if (!condition) throw new Error(message);
}

function same(actual, expected, message) {
  const a = JSON.stringify(actual);
  const b = JSON.stringify(expected);
  check(a === b, `${message}: ${a} is not ${b}`);
}

async function take(stream, count) {
  const taken = [];
  const deadline = Date.now() + WAIT_MS;
  const iterator = stream[Symbol.asyncIterator]();
  while (taken.length < count) {
    const left = deadline - Date.now();
    check(left > 0, `only ${taken.length} of ${count} deliveries within ${WAIT_MS} ms`);
    let timer;
    let next;
    try {
      next = await Promise.race([
        iterator.next(),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`only ${taken.length} of ${count} deliveries in time`)), left);
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
    check(!next.done, `the stream ended after ${taken.length} of ${count} deliveries`);
    taken.push(next.value);
  }
  return taken;
}

async function rejects(promise, Kind, field) {
  try {
    await promise;
  } catch (error) {
    check(error instanceof Kind, `expected ${Kind.name}, got ${error && error.name}: ${error}`);
    if (field !== undefined) same(error.field, field, `${Kind.name}'s field`);
    return error;
  }
  throw new Error(`expected ${Kind.name}, nothing was thrown`);
}

function unique(name) {
  return `${name}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

function clientFor(veil, broker, who) {
  return new veil.VeilClient({ url: broker.url, authHash: who, wsUrl: broker.wsUrl });
}

export const scenarios = {
  async "publications arrive in envelopes, in order, from the publisher the broker authenticated"(veil, broker) {
    const run = unique("order");
    const alice = clientFor(veil, broker, unique("alice"));
    const bob = clientFor(veil, broker, "js-bob");
    const { subscriptionId } = await alice.subscribe([{ key: "run", op: "eq", val: run }]);
    const stream = alice.deliveries(subscriptionId);
    const ids = [];
    for (let n = 0; n < 20; n++) ids.push(await bob.publish({ run, n, text: "ünïcode ✓" }));
    const got = await take(stream, 20);
    same(got.map((d) => d.id), ids, "ids");
    same(got.map((d) => d.publication.n), [...Array(20).keys()], "order");
    check(got.every((d) => d.publisher === "js-bob" && d.publication.text === "ünïcode ✓"), "publisher, payload");
    check(got.every((d, i) => i === 0 || d.seq > got[i - 1].seq), "seqs rise");
    same(got[0].subscriptionIds, [subscriptionId], "subscriptionIds");
    await stream.close();
  },

  async "a dropped connection resumes after the last delivery consumed, none lost or twice"(veil, broker) {
    const run = unique("resume");
    const alice = clientFor(veil, broker, unique("alice"));
    const { subscriptionId } = await alice.subscribe([{ key: "run", op: "eq", val: run }]);
    const stream = alice.deliveries(subscriptionId);
    const first = await alice.publishBatch([...Array(10).keys()].map((n) => ({ run, n })));
    same((await take(stream, 5)).map((d) => d.id), first.slice(0, 5), "before the drop");
    stream.reconnect();
    const second = await alice.publishBatch([...Array(5).keys()].map((n) => ({ run, n: 10 + n })));
    const after = await take(stream, 10);
    same(after.map((d) => d.id), [...first.slice(5), ...second], "after the drop");
    check(stream.reconnects >= 1, "it reconnected");
    await stream.close(); // (the delivery in hand is not consumed: it comes again)
    const third = await alice.publish({ run, n: 15 });
    const again = alice.deliveries(subscriptionId);
    same((await take(again, 2)).map((d) => d.id), [second[4], third], "a new stream, after what was consumed");
    again.consumed();
    await again.close();
    const fourth = await alice.publish({ run, n: 16 });
    const last = alice.deliveries(subscriptionId);
    same((await take(last, 1)).map((d) => d.id), [fourth], "after what was counted consumed");
    await last.close();
  },

  async "a multiplexed stream names each delivery's subscriptions and outlives one that ends"(veil, broker) {
    const run = unique("multi");
    const alice = clientFor(veil, broker, unique("alice"));
    const low = (await alice.subscribe([{ key: "run", op: "eq", val: run }, { key: "n", op: "lt", val: 10 }])).subscriptionId;
    const even = (await alice.subscribe([{ key: "run", op: "eq", val: run }, { key: "kind", op: "eq", val: "even" }])).subscriptionId;
    const stream = alice.multiplexed([low, even]);
    const both = await alice.publish({ run, n: 2, kind: "even" });
    const onlyLow = await alice.publish({ run, n: 3, kind: "odd" });
    // a publication for both comes once per line, naming both, unless one of them was reading its
    // backlog from the store meanwhile: then once for each (lines are not in one global order)
    const pairs = [];
    while (pairs.length < 3) {
      const [line] = await take(stream, 1);
      for (const id of line.subscriptionIds) pairs.push(`${line.id} ${id}`);
    }
    same(pairs.sort(), [`${both} ${low}`, `${both} ${even}`, `${onlyLow} ${low}`].sort(), "lines");
    await alice.unsubscribe(low);
    const later = await alice.publish({ run, n: 40, kind: "even" });
    same((await take(stream, 1)).map((d) => [d.id, d.subscriptionIds]), [[later, [even]]], "after one ended");
    check(stream.ended.get(low) instanceof veil.Gone, "the ended one's error");
    await stream.close();
  },

  async "the broker's refusals are typed errors naming what is wrong"(veil, broker) {
    const alice = clientFor(veil, broker, unique("alice"));
    await rejects(alice.subscribe([{ key: "n", op: "??", val: 1 }]), veil.BadRequest, "data[0].op");
    await rejects(alice.publish("not json"), veil.BadRequest);
    await rejects(alice.unsubscribe(unique("nobody")), veil.NotFound, "subscriptionId");
    const error = await rejects(take(alice.deliveries(unique("nobody")), 1), veil.NotFound, "subscriptionId");
    check(error instanceof veil.VeilError && error.status === 404, "a VeilError with its status");
    const mallory = clientFor(veil, broker, unique("mallory"));
    const { subscriptionId } = await alice.subscribe([]);
    await rejects(take(mallory.deliveries(subscriptionId), 1), veil.NotFound, "subscriptionId"); // alice's: none of hers
    const stream = alice.deliveries(subscriptionId);
    const waiting = take(stream, 1);
    await new Promise((resolve) => setTimeout(resolve, 500));
    await alice.unsubscribe(subscriptionId);
    await rejects(waiting, veil.Gone);
  },

  async "a publish under an idempotency key is logged once however often it is sent"(veil, broker) {
    const alice = clientFor(veil, broker, unique("alice"));
    const key = unique("key");
    const first = await alice.publish({ n: 1 }, { idempotencyKey: key });
    const again = await alice.publish({ n: 1 }, { idempotencyKey: key });
    same(again, first, "the repeat's id");
    const ids = await alice.publishBatch([{ n: 1 }, { n: 2 }, { n: 3 }]);
    check(ids.length === 3 && new Set(ids).size === 3, "a batch's ids");
    const listed = await alice.subscriptions();
    check(Array.isArray(listed), "subscriptions listed");
  },
};

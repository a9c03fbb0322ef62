/**
 * The errors a client meets, one class per kind of answer, so that an application catches what it
 * can handle (`if (e instanceof Overloaded) retry later`) rather than comparing status codes. They
 * are the broker's error documents (`{"error", "field", "status"}`) as a client receives them.
 */

export class VeilError extends Error {
  /** The HTTP status the broker answered with (0: not an answer of the broker's). */
  readonly status: number;
  /** Where the problem is: a request member, a header, "handshake" ... ("" when none is named). */
  readonly field: string;
  /** What is wrong, as the broker said it. */
  readonly problem: string;

  constructor(field: string, problem: string, status: number) {
    super(field ? `${status} ${field}: ${problem}` : `${status} ${problem}`);
    this.name = new.target.name;
    this.status = status;
    this.field = field;
    this.problem = problem;
  }
}

/** 400: the request or handshake is malformed; `field` says where. */
export class BadRequest extends VeilError {}
/** 401: no proof of identity the broker accepts. */
export class Unauthorized extends VeilError {}
/** 403: the client may not do this, or the id is held by another client's subscription. */
export class Forbidden extends VeilError {}
/** 404: no such subscription (another client's is answered as none), announcement or publication. */
export class NotFound extends VeilError {}
/** 409: another connection took over the subscription, or it is delivered to its webhook. */
export class Replaced extends VeilError {}
/** 410: the subscription was removed. */
export class Gone extends VeilError {}
/** 413: the request is larger than the broker takes. */
export class TooLarge extends VeilError {}
/** 422: the broker set the subscription aside (it could not process it). */
export class Quarantined extends VeilError {}
/** 429: the client has as many of something as it may (subscriptions, connections). */
export class TooMany extends VeilError {}

/** 503: the broker cannot take this now; retry later (`retryAfter`: the seconds it asked for). */
export class Overloaded extends VeilError {
  retryAfter: number | null = null;
}

/**
 * The broker sent what the protocol does not allow (a message that is no envelope, a sequence
 * number out of range, subscriptions the connection does not carry). A delivery stream reconnects,
 * backing off, and gives up with this error once that keeps happening.
 */
export class BrokerFault extends VeilError {}

const BY_STATUS: Record<number, new (field: string, problem: string, status: number) => VeilError> = {
  400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Replaced, 410: Gone, 413: TooLarge,
  422: Quarantined, 429: TooMany, 503: Overloaded,
};

/** Errors a delivery stream ends with: reconnecting would only be refused again. */
export const FATAL = [BadRequest, Unauthorized, Forbidden, NotFound, Replaced, Gone];

export function errorFor(status: number, field: string, problem: string): VeilError {
  const Kind = BY_STATUS[status] ?? VeilError;
  return new Kind(field, problem, status);
}

/** The error an error document reports; members of the wrong type count as missing. */
export function errorFromDocument(doc: Record<string, unknown>, status = 0): VeilError {
  const code = doc["status"];
  const field = doc["field"];
  const problem = doc["error"];
  return errorFor(
    typeof code === "number" && Number.isInteger(code) ? code : status,
    typeof field === "string" ? field : "",
    typeof problem === "string" ? problem : "",
  );
}

/** The error an HTTP answer reports, readable or not. */
export function errorFromBody(status: number, body: string): VeilError {
  try {
    const doc: unknown = JSON.parse(body);
    if (doc !== null && typeof doc === "object" && !Array.isArray(doc)) {
      return errorFromDocument(doc as Record<string, unknown>, status);
    }
  } catch {
    // not JSON: the body is the problem
  }
  return errorFor(status, "", body.slice(0, 500));
}

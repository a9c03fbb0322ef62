export { VeilClient } from "./client.js";
export type {
  ClientOptions, Constraint, PublishOptions, SubscribeOptions, SubscribeReply, WebSocketConstructor,
} from "./client.js";
export { DeliveryStream } from "./deliveries.js";
export type { Delivery, StreamOptions } from "./deliveries.js";
export {
  BadRequest, BrokerFault, Forbidden, Gone, NotFound, Overloaded, Quarantined, Replaced, TooLarge, TooMany,
  Unauthorized, VeilError,
} from "./errors.js";

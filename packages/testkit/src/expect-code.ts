/** Assertions on gRPC outcomes. */
import { ClientError, Status } from 'nice-grpc-common';

/**
 * expectCode awaits p and asserts it failed with a ClientError of code (a gRPC Status);
 * `message` (a RegExp or substring) is matched against the error's details. Returns the error.
 */
export async function expectCode(p: Promise<unknown>, code: Status, message?: RegExp | string): Promise<ClientError> {
  let err: unknown;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  if (!(err instanceof ClientError)) throw new Error(`expected ${Status[code]}, got ${err === undefined ? 'success' : String(err)}`);
  if (err.code !== code) throw new Error(`expected ${Status[code]}, got ${Status[err.code]}: ${err.details}`);
  if (message !== undefined && !(typeof message === 'string' ? err.details.includes(message) : message.test(err.details))) {
    throw new Error(`${Status[code]} as expected, but its details ${JSON.stringify(err.details)} do not match ${String(message)}`);
  }
  return err;
}

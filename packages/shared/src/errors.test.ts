import { ClientError, ServerError, Status } from 'nice-grpc-common';
import { AbortedError, FailedPreconditionError, fromClientError, InvalidArgumentError, NotFoundError, toServerError } from './errors';

describe('error vocabulary', () => {
  it.each([
    [new InvalidArgumentError('x'), Status.INVALID_ARGUMENT],
    [new NotFoundError('x'), Status.NOT_FOUND],
    [new FailedPreconditionError('x'), Status.FAILED_PRECONDITION],
    [new AbortedError('x'), Status.ABORTED],
  ])('%s maps to its status', (err, code) => {
    const s = toServerError(err);
    expect(s).toBeInstanceOf(ServerError);
    expect(s?.code).toBe(code);
    expect(s?.details).toBe('x');
  });
  it('passes a peer error through with its code', () => {
    expect(toServerError(new ClientError('/p.S/M', Status.NOT_FOUND, 'gone'))?.code).toBe(Status.NOT_FOUND);
  });
  it('leaves unknown errors unmapped (they become UNKNOWN without details)', () => {
    expect(toServerError(new Error('secret stack'))).toBeUndefined();
  });
  it('maps client errors back to domain errors', () => {
    expect(fromClientError(new ClientError('/p.S/M', Status.FAILED_PRECONDITION, 'no'))).toBeInstanceOf(FailedPreconditionError);
  });
});

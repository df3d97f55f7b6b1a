/** `sandbox exec` of a command that is not in the sandbox exits 127 (as sh and docker exec), told apart from podd's other NOT_FOUNDs. */
import { ClientError, Status } from 'nice-grpc-common';
import { commandNotFound, EXIT_COMMAND_NOT_FOUND } from './sandbox-exec';

describe('exec: command not found', () => {
  it("is podd's NOT_FOUND for argv[0] only", () => {
    expect(EXIT_COMMAND_NOT_FOUND).toBe(127);
    expect(commandNotFound(new ClientError('/x', Status.NOT_FOUND, 'argv[0]: /nonexistent: command not found'))).toBe(true);
    expect(commandNotFound(new ClientError('/x', Status.NOT_FOUND, 'sandbox sb-1 not found'))).toBe(false);
    expect(commandNotFound(new ClientError('/x', Status.FAILED_PRECONDITION, 'argv[0]: x: command not found'))).toBe(false);
    expect(commandNotFound(new Error('argv[0]: x: command not found'))).toBe(false);
  });
});

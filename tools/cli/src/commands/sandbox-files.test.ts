import { ClientError, Status } from 'nice-grpc-common';
import { describeError } from '../output';
import { stdinTooLarge, MAX_EXEC_STDIN_BYTES } from './sandbox-exec';
import { parseRemote } from './sandbox-files';

describe('sandbox cp operands', () => {
  test('sb-<16 hex>:PATH is a sandbox path, anything else is local', () => {
    expect(parseRemote('sb-0123456789abcdef:/workspace/f')).toEqual({ sandboxId: 'sb-0123456789abcdef', path: '/workspace/f' });
    expect(parseRemote('sb-0123456789abcdef:')).toEqual({ sandboxId: 'sb-0123456789abcdef', path: '' });
    expect(parseRemote('./sb-0123456789abcdef:/f')).toBeUndefined();
    expect(parseRemote('sb-0123:/f')).toBeUndefined();
    expect(parseRemote('/tmp/f')).toBeUndefined();
  });
});

describe('exec --stdin above its limit', () => {
  const refused = new ClientError('/sandnode.server.v1.SandboxService/Exec', Status.RESOURCE_EXHAUSTED, 'Received message larger than max (5242900 vs 4194304)');
  test('says the limit and points to sandbox cp, keeping the gRPC code for --json', () => {
    const r = describeError(stdinTooLarge(refused, 5 * 1024 * 1024, 'sb-0123456789abcdef'));
    expect(r.message).toMatch(
      /^stdin is limited to 3145728 bytes \(3 MiB\) per exec by this server \(it has no ExecStream\), this was 5242880; .*sandnode sandbox cp FILE sb-0123456789abcdef:\/workspace\/FILE/,
    );
    expect(r).toMatchObject({ code: 'RESOURCE_EXHAUSTED', grpcCode: Status.RESOURCE_EXHAUSTED });
  });
  test('other errors, and a refusal of stdin within the limit, pass unchanged', () => {
    expect(stdinTooLarge(refused, MAX_EXEC_STDIN_BYTES, 'sb-0123456789abcdef')).toBe(refused);
    const nf = new ClientError('/x', Status.NOT_FOUND, 'no such sandbox');
    expect(stdinTooLarge(nf, 5 * 1024 * 1024, 'sb-0123456789abcdef')).toBe(nf);
  });
});

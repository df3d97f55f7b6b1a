/** poolView: the `pool status --json` / `pool set --json` shape of a decoded PoolStatus. */
import { PoolStatus } from '@sandnode/shared/proto/server/v1/admin';
import { poolView } from './pool';

describe('poolView', () => {
  it('keeps the fields and drops the decoder internals (_unknownFields) of the message and its resources', () => {
    const decoded = PoolStatus.decode(
      PoolStatus.encode(
        PoolStatus.fromPartial({
          key: 'base',
          template: 'base',
          resources: { vcpus: 1, memoryMib: 512, diskBytes: 1073741824, pids: 0 },
          size: 2,
          ready: 1,
          filling: 1,
          claimed: 3,
          missed: 1,
          lastError: '',
        }),
      ).finish(),
    );
    const v = poolView(decoded);
    expect(JSON.stringify(v)).not.toContain('_unknownFields');
    expect(v).toEqual({ key: 'base', template: 'base', resources: { vcpus: 1, memoryMib: 512, diskBytes: 1073741824, pids: 0 }, size: 2, ready: 1, filling: 1, claimed: 3, missed: 1, lastError: '' });
  });

  it('gives null resources when the server sent none', () => {
    expect(poolView(PoolStatus.fromPartial({ key: 'base', template: 'base' })).resources).toBeNull();
  });
});

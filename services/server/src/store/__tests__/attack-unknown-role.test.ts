/**
 * Adversarial finding (issue 11, "unknown enum values are lost on rewrite"): a device a newer
 * server recorded with a role this version cannot name (9) must survive every read-modify-write
 * (SetTimeout, pause, resume) and must still be torn down with its sandbox.
 */
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { ownedDeviceIds } from '../../core/provision';
import { decodeRecord, encodeRecord } from '../record-codec';

const ID = 'sb-0123456789abcdef';

function recordWithRole9(): Uint8Array {
  return RuntimeRecord.encode(
    RuntimeRecord.fromPartial({
      schema: 1,
      sandboxId: ID,
      state: SandboxState.SANDBOX_STATE_RUNNING,
      devices: [
        { deviceId: `${ID}-upper`, role: 1, path: '/dev/loop1', backingFile: '/s/images/u.img', sizeBytes: 1 },
        { deviceId: `${ID}-ws`, role: 2, path: '/dev/loop2', backingFile: '/s/images/w.img', sizeBytes: 1 },
        // a role of a newer release (say a scratch disk)
        { deviceId: `${ID}-scratch`, role: 9 as never, path: '/dev/loop3', backingFile: '/s/images/s.img', sizeBytes: 1 },
      ],
    }),
  ).finish();
}

describe('a device with a role this version does not know', () => {
  it('survives a read-modify-write (SetTimeout)', () => {
    const rec = decodeRecord(recordWithRole9());
    rec.expiresAtMs = 1234;
    const again = RuntimeRecord.decode(encodeRecord(rec));
    expect(again.devices.map((d) => [d.deviceId, d.role])).toEqual([
      [`${ID}-upper`, 1],
      [`${ID}-ws`, 2],
      [`${ID}-scratch`, 9],
    ]);
  });

  it('is among the devices a teardown deletes', () => {
    expect(ownedDeviceIds(decodeRecord(recordWithRole9()))).toContain(`${ID}-scratch`);
  });
});

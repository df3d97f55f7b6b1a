/**
 * Host peers' errors as a caller sees them: INTERNAL / UNKNOWN answers (which carry command
 * lines and stderr of the host) are logged with the error object and replaced by a message
 * that names only the peer and the call; every other code passes unchanged.
 */
import { ClientError, Status } from 'nice-grpc-common';
import { CommandError, InternalError, UnavailableError, type Logger } from '@sandnode/shared';
import { guardDevicePort, guardVmPort, mapPeerError } from './peer-errors';
import type { DevicePort, VmPort } from './types';

/** A logger that keeps what it is given: the fields object and the message. */
function capture(): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const at = (level: string) => (obj: Record<string, unknown>, msg?: string) => void lines.push({ level, ...obj, msg });
  const log = { error: at('error'), warn: at('warn'), info: at('info'), debug: at('debug'), child: () => log } as unknown as Logger;
  return { log, lines };
}

const STDERR = 'runc: /var/lib/secret/path: permission denied';

describe('peer errors', () => {
  it('hides a host INTERNAL (ClientError or CommandError) behind the peer and call, and logs the error object', async () => {
    const { log, lines } = capture();
    for (const err of [new ClientError('/sandnode.vmm.v1.VmService/CreateVm', Status.INTERNAL, `runc create failed: ${STDERR}`), new CommandError(`runc create: exit 1: ${STDERR}`, STDERR, 1)]) {
      const mapped = mapPeerError(err, 'vmm-supervisor', 'CreateVm', log);
      expect(mapped).toBeInstanceOf(InternalError);
      expect((mapped as Error).message).toBe('vmm-supervisor CreateVm failed; the server log has the details');
      expect((mapped as Error).message).not.toContain('secret');
    }
    expect(lines).toHaveLength(2);
    for (const l of lines) {
      expect(l).toMatchObject({ level: 'error', peer: 'vmm-supervisor', call: 'CreateVm', msg: 'peer call failed' });
      // the error object (pino logs its stack), not only its message
      expect(l.err).toBeInstanceOf(Error);
      expect(String((l.err as Error).message)).toContain('secret');
    }
  });

  it('passes retryable and request codes unchanged, and values that are no status error', () => {
    const { log, lines } = capture();
    const passing = [
      new ClientError('/x', Status.UNAVAILABLE, 'connect ECONNREFUSED'),
      new ClientError('/x', Status.ABORTED, 'stale epoch 3'),
      new ClientError('/x', Status.NOT_FOUND, 'vm sb-1 not found'),
      new ClientError('/x', Status.RESOURCE_EXHAUSTED, 'no free loop device'),
      new UnavailableError('restarting'),
      new Error('a bug'),
      'a string',
    ];
    for (const e of passing) expect(mapPeerError(e, 'ublk-manager', 'CreateDevice', log)).toBe(e);
    expect(lines).toEqual([]);
  });

  it('the guarded ports map every call and return the answers as they are', async () => {
    const { log } = capture();
    const boom = () => Promise.reject(new ClientError('/x', Status.INTERNAL, STDERR));
    const vms = guardVmPort({ create: boom, get: async () => undefined, list: async () => [], pause: boom, resume: boom, freezeStatus: boom, delete: boom } as unknown as VmPort, log);
    await expect(vms.create({} as Parameters<VmPort['create']>[0])).rejects.toThrow('vmm-supervisor CreateVm failed; the server log has the details');
    await expect(vms.pause('sb-1')).rejects.toThrow('vmm-supervisor PauseVm failed');
    await expect(vms.delete('sb-1')).rejects.toThrow('vmm-supervisor DeleteVm failed');
    expect(await vms.get('sb-1')).toBeUndefined();
    const devices = guardDevicePort({ createEmpty: boom, clone: boom, version: async () => ({ version: '1', features: ['ublk.clone'] }), get: boom, list: boom, delete: boom } as unknown as DevicePort, log);
    await expect(devices.clone('a', 'b', true, 100)).rejects.toThrow('ublk-manager CloneDevice failed');
    await expect(devices.createEmpty('a', 1)).rejects.toThrow('ublk-manager CreateDevice failed');
    expect(await devices.version()).toEqual({ version: '1', features: ['ublk.clone'] });
  });
});

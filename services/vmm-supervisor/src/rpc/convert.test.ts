import { vmSpecFromProto, vmSpecToProto } from './convert';
import type { VmSpec } from '../core/types';

const base: VmSpec = {
  templateRootfs: '/t',
  drives: [{ driveId: 'upper', path: '/dev/loop1', role: 'rootfs-upper', readOnly: false }],
  resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 },
  poddSocketDir: '/p',
  hostname: '',
  env: {},
};

describe('machine_id on the wire', () => {
  test('round-trips', () => {
    const id = '0123456789abcdef0123456789abcdef';
    const wire = vmSpecToProto({ ...base, machineId: id });
    expect(wire.machineId).toBe(id);
    expect(vmSpecFromProto(wire)?.machineId).toBe(id);
  });
  test('a stored spec of 0.1.0 (no machineId) is echoed as empty', () => {
    expect(vmSpecToProto(base).machineId).toBe('');
  });
});

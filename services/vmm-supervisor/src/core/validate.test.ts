import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';
import type { VmSpec } from './types';
import { canonicalSpec, checkHostPaths, MAX_PODD_SOCKET_DIR_BYTES, MAX_VM_ENV_BYTES, validateVmSpec } from './validate';
import { useTempDir } from '@sandnode/testkit';

const spec = (over: Partial<VmSpec> = {}): VmSpec => ({
  templateRootfs: '/var/lib/sandnode/templates/base/rootfs',
  drives: [
    { driveId: 'upper', path: '/dev/loop1', role: 'rootfs-upper', readOnly: false },
    { driveId: 'ws', path: '/dev/loop2', role: 'workspace', readOnly: false },
  ],
  resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 },
  poddSocketDir: '/run/sandnode/sandboxes/vm-1',
  hostname: '',
  env: {},
  ...over,
});

function invalid(vmId: string, s: VmSpec | undefined, field: string): void {
  let err: unknown;
  try {
    validateVmSpec(vmId, s);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(InvalidArgumentError);
  expect((err as Error).message).toContain(field);
}

describe('validateVmSpec', () => {
  test('accepts a good spec', () => {
    expect(() => validateVmSpec('vm-1', spec())).not.toThrow();
    expect(() => validateVmSpec('vm-1', spec({ drives: [spec().drives[0]!] }))).not.toThrow();
    expect(() => validateVmSpec('vm-1', spec({ resources: { vcpus: 64, memoryMib: 32, diskBytes: 0 } }))).not.toThrow();
    expect(() => validateVmSpec('vm-1', spec({ resources: { vcpus: 1, memoryMib: 65536, diskBytes: 0 } }))).not.toThrow();
  });

  test('vm_id must be a resource id', () => {
    invalid('', spec(), 'vm_id');
    invalid('VM', spec(), 'vm_id');
    invalid('-vm', spec(), 'vm_id');
    invalid('a'.repeat(64), spec(), 'vm_id');
  });

  test('spec is required', () => invalid('vm-1', undefined, 'spec'));

  test('drives: exactly one upper, at most one workspace, known roles, unique ids', () => {
    const [upper, ws] = spec().drives as [VmSpec['drives'][0], VmSpec['drives'][0]];
    invalid('vm-1', spec({ drives: [] }), 'spec.drives');
    invalid('vm-1', spec({ drives: [ws] }), 'spec.drives');
    invalid('vm-1', spec({ drives: [upper, { ...upper, driveId: 'u2' }] }), 'spec.drives');
    invalid('vm-1', spec({ drives: [upper, ws, { ...ws, driveId: 'w2' }] }), 'spec.drives');
    invalid('vm-1', spec({ drives: [upper, { ...ws, role: 'unspecified' }] }), 'spec.drives[1].role');
    invalid('vm-1', spec({ drives: [upper, { ...ws, driveId: 'upper' }] }), 'spec.drives');
    invalid('vm-1', spec({ drives: [{ ...upper, driveId: 'Bad' }] }), 'spec.drives[0].drive_id');
    invalid('vm-1', spec({ drives: [{ ...upper, path: 'dev/loop1' }] }), 'spec.drives[0].path');
    invalid('vm-1', spec({ drives: [{ ...upper, readOnly: true }] }), 'spec.drives[0].read_only');
  });

  test('template_rootfs and podd_socket_dir must be absolute', () => {
    invalid('vm-1', spec({ templateRootfs: '' }), 'spec.template_rootfs');
    invalid('vm-1', spec({ templateRootfs: 'rootfs' }), 'spec.template_rootfs');
    invalid('vm-1', spec({ templateRootfs: '/a,b' }), 'spec.template_rootfs');
    invalid('vm-1', spec({ poddSocketDir: 'run/x' }), 'spec.podd_socket_dir');
  });

  test('podd_socket_dir must leave room for its socket name in a unix socket address', () => {
    const longest = `/${'d'.repeat(MAX_PODD_SOCKET_DIR_BYTES - 1)}`;
    expect(() => validateVmSpec('vm-1', spec({ poddSocketDir: longest }))).not.toThrow();
    invalid('vm-1', spec({ poddSocketDir: `${longest}d` }), 'spec.podd_socket_dir: longer than 97 bytes');
  });

  test('resources out of range', () => {
    invalid('vm-1', spec({ resources: { vcpus: 65, memoryMib: 0, diskBytes: 0 } }), 'spec.resources.vcpus');
    invalid('vm-1', spec({ resources: { vcpus: 0, memoryMib: 31, diskBytes: 0 } }), 'spec.resources.memory_mib');
    invalid('vm-1', spec({ resources: { vcpus: 0, memoryMib: 65537, diskBytes: 0 } }), 'spec.resources.memory_mib');
  });

  test('hostname and env', () => {
    invalid('vm-1', spec({ hostname: 'bad_host' }), 'spec.hostname');
    invalid('vm-1', spec({ env: { 'A=B': 'x' } }), 'spec.env');
    invalid('vm-1', spec({ env: { A: 'x\0y' } }), 'spec.env');
  });

  test('issue 11: env and paths are bounded so that the row stays under the store bound', () => {
    expect(() => validateVmSpec('vm-1', spec({ env: { A: 'x'.repeat(MAX_VM_ENV_BYTES - 3) } }))).not.toThrow();
    invalid('vm-1', spec({ env: { A: 'x'.repeat(MAX_VM_ENV_BYTES - 2) } }), 'spec.env');
    invalid('vm-1', spec({ env: { A: 'x'.repeat(5 * 1024 * 1024) } }), 'spec.env');
    invalid('vm-1', spec({ templateRootfs: `/${'t'.repeat(5000)}` }), 'spec.template_rootfs');
    invalid('vm-1', spec({ drives: [{ driveId: 'upper', path: `/${'d'.repeat(5000)}`, role: 'rootfs-upper', readOnly: false }] }), 'spec.drives[0].path');
  });
});

describe('checkHostPaths', () => {
  const tmp = useTempDir('vmm-validate');
  test('a missing template or drive is FAILED_PRECONDITION naming the field', () => {
    const dir = tmp();
    const ok = spec({ templateRootfs: dir, drives: [{ driveId: 'u', path: '/dev/null', role: 'rootfs-upper', readOnly: false }] });
    expect(() => checkHostPaths(ok)).not.toThrow();
    expect(() => checkHostPaths({ ...ok, templateRootfs: path.join(dir, 'nope') })).toThrow(FailedPreconditionError);
    expect(() => checkHostPaths({ ...ok, drives: [{ ...ok.drives[0]!, path: '/dev/no-such-dev' }] })).toThrow(/spec\.drives\[0\]\.path/);
  });
});

describe('machine_id', () => {
  test('empty or 32 lowercase hex; anything else is INVALID_ARGUMENT naming spec.machine_id', () => {
    expect(() => validateVmSpec('vm-1', spec({ machineId: '' }))).not.toThrow();
    expect(() => validateVmSpec('vm-1', spec({ machineId: 'ab'.repeat(16) }))).not.toThrow();
    invalid('vm-1', spec({ machineId: 'AB'.repeat(16) }), 'spec.machine_id');
    invalid('vm-1', spec({ machineId: 'ab'.repeat(15) }), 'spec.machine_id');
  });

  test('a row without machineId (0.1.0) equals a request with an empty one; a set one differs', () => {
    const old = spec();
    delete (old as Partial<VmSpec>).machineId;
    expect(canonicalSpec(old)).toBe(canonicalSpec(spec({ machineId: '' })));
    expect(canonicalSpec(old)).not.toBe(canonicalSpec(spec({ machineId: 'ab'.repeat(16) })));
  });
});

describe('canonicalSpec', () => {
  test('ignores env key order, sees every other change', () => {
    expect(canonicalSpec(spec({ env: { A: '1', B: '2' } }))).toBe(canonicalSpec(spec({ env: { B: '2', A: '1' } })));
    expect(canonicalSpec(spec())).not.toBe(canonicalSpec(spec({ hostname: 'x' })));
  });
});

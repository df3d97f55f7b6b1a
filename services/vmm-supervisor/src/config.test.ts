import { ConfigError, createLogger } from '@sandnode/shared';
import { loadVmmConfig } from './config';
import { createDriver } from './drivers/select';

describe('loadVmmConfig', () => {
  test('defaults derive listen and runcRoot from runDir', () => {
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_RUN_DIR: '/tmp/sn-run' } });
    expect(c.listen).toBe('unix:///tmp/sn-run/vmm-supervisor.sock');
    expect(c.runcRoot).toBe('/tmp/sn-run/runc');
    expect(c).toMatchObject({ driver: 'runc', runcBinary: 'runc', defaultVcpus: 1, defaultMemoryMib: 512, stopTimeoutMs: 2000, logLevel: 'info' });
  });

  test('env values are coerced and validated with the key named', () => {
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_STOP_TIMEOUT_MS: '500' } }).stopTimeoutMs).toBe(500);
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DEFAULT_VCPUS: '0' } })).toThrow(/defaultVcpus/);
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DRIVER: 'qemu' } })).toThrow(ConfigError);
  });
});

describe('createDriver', () => {
  test('firecracker is not built in this release and says so', () => {
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker' } });
    expect(() => createDriver(c, createLogger('vmm-supervisor-test', '0.0.0', 'silent'))).toThrow(/firecracker.*not built/);
  });
});

import { rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ConfigError, createLogger } from '@sandnode/shared';
import { DEFAULT_KERNEL_ARGS, loadVmmConfig } from './config';
import { createDriver } from './drivers/select';
import { FAILPOINTS, FAILPOINTS_ENV, failpoints } from './core/failpoints';
import { parseArgs } from './main';
import { makeTempDir } from '@sandnode/testkit';

const tmp = makeTempDir('vmm-cfg');
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('loadVmmConfig', () => {
  test('network keys: defaults, the tag from the state dir, the pool always denied; bad values name the key', () => {
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_STATE_DIR: '/var/lib/sn-test' } });
    expect(c).toMatchObject({ network: true, networkPool: '10.209.0.0/16', networkSpareSlots: 2, dnsPort: 15053, egressProxyPort: 15080, egressProxiedPorts: [80, 443] });
    expect(c.networkTag).toMatch(/^[0-9a-f]{4}$/);
    expect(c.networkAlwaysDenied).toEqual(expect.arrayContaining(['10.0.0.0/8', '169.254.0.0/16', '10.209.0.0/16']));
    const e = loadVmmConfig({
      env: {
        SANDNODE_VMM_SUPERVISOR_NETWORK: 'false',
        SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: '10.77.0.0/20',
        SANDNODE_VMM_SUPERVISOR_NETWORK_TAG: 'ab1',
        SANDNODE_VMM_SUPERVISOR_EGRESS_PROXIED_PORTS: '[443, 80, 8080, 80]',
        SANDNODE_VMM_SUPERVISOR_NETWORK_ALWAYS_DENIED: '["192.168.0.0/16"]',
      },
    });
    expect(e).toMatchObject({ network: false, networkPool: '10.77.0.0/20', networkTag: 'ab1', egressProxiedPorts: [80, 443, 8080], networkAlwaysDenied: ['192.168.0.0/16', '10.77.0.0/20'] });
    const bad: [Record<string, string>, RegExp][] = [
      [{ SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: '10.209.1.0/16' }, /networkPool.*host bits/],
      [{ SANDNODE_VMM_SUPERVISOR_NETWORK_POOL: '10.0.0.0/30' }, /networkPool.*8\.\.28/],
      [{ SANDNODE_VMM_SUPERVISOR_NETWORK_TAG: 'TOOLONG' }, /networkTag/],
      [{ SANDNODE_VMM_SUPERVISOR_EGRESS_PROXIED_PORTS: '[0]' }, /egressProxiedPorts/],
      [{ SANDNODE_VMM_SUPERVISOR_NETWORK_ALWAYS_DENIED: '["nope"]' }, /networkAlwaysDenied\[0\]/],
      [{ SANDNODE_VMM_SUPERVISOR_DNS_PORT: '15080' }, /egressProxyPort.*dnsPort/],
      [{ SANDNODE_VMM_SUPERVISOR_NETWORK: 'maybe' }, /network/],
    ];
    for (const [env, why] of bad) {
      expect(() => loadVmmConfig({ env })).toThrow(ConfigError);
      expect(() => loadVmmConfig({ env })).toThrow(why);
    }
  });

  test('defaults derive listen and runcRoot from runDir', () => {
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_RUN_DIR: '/tmp/sn-run' } });
    expect(c.listen).toBe('unix:///tmp/sn-run/vmm-supervisor.sock');
    expect(c.runcRoot).toBe('/tmp/sn-run/runc');
    expect(c).toMatchObject({ driver: 'runc', runcBinary: 'runc', defaultVcpus: 1, defaultMemoryMib: 512, stopTimeoutMs: 2000, logLevel: 'info' });
  });

  test('listen is a unix socket only: a TCP address is refused naming the key (no TCP authentication)', () => {
    for (const listen of ['127.0.0.1:7071', '0.0.0.0:7071', 'unix:relative.sock']) {
      expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_LISTEN: listen } })).toThrow(ConfigError);
      expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_LISTEN: listen } })).toThrow(/listen.*unix socket/);
    }
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_LISTEN: 'unix:///tmp/x.sock' } }).listen).toBe('unix:///tmp/x.sock');
  });

  test('env values are coerced and validated with the key named', () => {
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_STOP_TIMEOUT_MS: '500' } }).stopTimeoutMs).toBe(500);
    expect(loadVmmConfig({ env: {} })).toMatchObject({ runcStartTimeoutMs: 30_000, killWaitMs: 5000, drainMs: 5000 });
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_RUNC_START_TIMEOUT_MS: '90000', SANDNODE_VMM_SUPERVISOR_KILL_WAIT_MS: '250' } })).toMatchObject({
      runcStartTimeoutMs: 90_000,
      killWaitMs: 250,
    });
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_KILL_WAIT_MS: '5' } })).toThrow(/killWaitMs/);
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DEFAULT_VCPUS: '0' } })).toThrow(/defaultVcpus/);
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DRIVER: 'qemu' } })).toThrow(ConfigError);
  });

  test('metricsListen is 127.0.0.1:9465 by default, "host:port" or "" (off) when set, and refused otherwise naming the key', () => {
    expect(loadVmmConfig({ env: {} }).metricsListen).toBe('127.0.0.1:9465');
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: '' } }).metricsListen).toBe('');
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: '127.0.0.1:9465' } }).metricsListen).toBe('127.0.0.1:9465');
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: '9465' } })).toThrow(/metricsListen.*host:port/);
  });

  test('io limits: 0 (none) by default; set by env; a weight outside 10..1000 is refused naming the key', () => {
    expect(loadVmmConfig({ env: {} }).io).toEqual({ readBps: 0, writeBps: 0, readIops: 0, writeIops: 0, weight: 0 });
    const c = loadVmmConfig({
      env: {
        SANDNODE_VMM_SUPERVISOR_IO_READ_BPS: '1000',
        SANDNODE_VMM_SUPERVISOR_IO_WRITE_BPS: '4194304',
        SANDNODE_VMM_SUPERVISOR_IO_READ_IOPS: '30',
        SANDNODE_VMM_SUPERVISOR_IO_WRITE_IOPS: '40',
        SANDNODE_VMM_SUPERVISOR_IO_WEIGHT: '500',
      },
    });
    expect(c.io).toEqual({ readBps: 1000, writeBps: 4194304, readIops: 30, writeIops: 40, weight: 500 });
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_IO_WEIGHT: '5' } })).toThrow(/ioWeight/);
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_IO_WEIGHT: '1001' } })).toThrow(/ioWeight/);
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_IO_WRITE_BPS: '-1' } })).toThrow(/ioWriteBps/);
  });

  test('usernsRange: on by default (host 100000.. = 0.. inside), "" turns it off, a bad range is refused naming the key', () => {
    expect(loadVmmConfig({ env: {} }).usernsRange).toEqual({ hostId: 100000, size: 65536 });
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_USERNS_RANGE: '' } }).usernsRange).toBeUndefined();
    expect(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_USERNS_RANGE: '200000:65536' } }).usernsRange).toEqual({ hostId: 200000, size: 65536 });
    expect(() => loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_USERNS_RANGE: '10:10' } })).toThrow(/usernsRange/);
  });
});

describe('createDriver', () => {
  const log = createLogger('vmm-supervisor-test', '0.0.0', 'silent');
  test('firecracker needs kernelImage, and says so naming the key', () => {
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker', SANDNODE_VMM_SUPERVISOR_RUN_DIR: tmp } });
    expect(() => createDriver(c, log)).toThrow(/key "kernelImage": required with driver "firecracker"/);
    const missing = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker', SANDNODE_VMM_SUPERVISOR_KERNEL_IMAGE: '/no/such/vmlinux', SANDNODE_VMM_SUPERVISOR_RUN_DIR: tmp } });
    expect(() => createDriver(missing, log)).toThrow(/key "kernelImage": \/no\/such\/vmlinux does not exist/);
  });

  test('firecracker keys have defaults; a kernel image that exists gives the firecracker driver', () => {
    const kernel = path.join(tmp, 'vmlinux');
    writeFileSync(kernel, '');
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker', SANDNODE_VMM_SUPERVISOR_KERNEL_IMAGE: kernel, SANDNODE_VMM_SUPERVISOR_RUN_DIR: tmp } });
    expect(c).toMatchObject({ firecrackerBinary: 'firecracker', kernelArgs: DEFAULT_KERNEL_ARGS, kernelImage: kernel });
    const d = createDriver(c, log);
    expect(d.name).toBe('firecracker');
    expect(d.features).toEqual(['vmm.firecracker']);
  });

  test('a driver binary that is not in PATH is a ConfigError naming the key', () => {
    const c = loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_RUNC_BINARY: 'no-such-runc-binary', SANDNODE_VMM_SUPERVISOR_RUN_DIR: tmp, SANDNODE_VMM_SUPERVISOR_USERNS_RANGE: '' } });
    expect(() => createDriver(c, log).configuredBinary()).toThrow(/key "runcBinary": "no-such-runc-binary" was not found in PATH/);
  });

  (process.getuid?.() === 0 ? test : test.skip)('the runc driver lists vmm.userns.v1 only with a usernsRange; its vms dir is then root:<range gid> 0710', () => {
    const off = createDriver(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_RUN_DIR: path.join(tmp, 'off'), SANDNODE_VMM_SUPERVISOR_USERNS_RANGE: '' } }), log);
    expect(off.features).not.toContain('vmm.userns.v1');
    expect(statSync(path.join(tmp, 'off', 'vms')).mode & 0o7777).toBe(0o700);
    const on = createDriver(loadVmmConfig({ env: { SANDNODE_VMM_SUPERVISOR_RUN_DIR: path.join(tmp, 'on') } }), log);
    expect(on.features).toContain('vmm.userns.v1');
    const st = statSync(path.join(tmp, 'on', 'vms'));
    expect([st.uid, st.gid, st.mode & 0o7777]).toEqual([0, 100000, 0o710]);
  });
});

describe('parseArgs', () => {
  test('--config FILE and --config=FILE', () => {
    expect(parseArgs([])).toEqual({ configFile: undefined, help: false });
    expect(parseArgs(['--config', '/c.json'])).toEqual({ configFile: '/c.json', help: false });
    expect(parseArgs(['--config=/c.json'])).toEqual({ configFile: '/c.json', help: false });
  });

  test('--help and -h ask for the usage (main prints it and exits 0 without starting)', () => {
    expect(parseArgs(['--help']).help).toBe(true);
    expect(parseArgs(['-h']).help).toBe(true);
  });

  test('--config without a value and unknown arguments are usage errors naming them', () => {
    expect(() => parseArgs(['--config'])).toThrow(/--config needs a value/);
    expect(() => parseArgs(['--config='])).toThrow(/--config needs a value/);
    expect(() => parseArgs(['--config', '--verbose'])).toThrow(/--config needs a value/);
    expect(() => parseArgs(['--verbose'])).toThrow(/unknown argument "--verbose" \(usage: sandnode-vmm-supervisor \[--config FILE\]\)/);
  });
});

describe('failpoints', () => {
  afterEach(() => failpoints.set(''));
  test('SANDNODE_VMM_SUPERVISOR_FAILPOINTS: a bare name means kill; unknown names are refused naming them', () => {
    expect(FAILPOINTS_ENV).toBe('SANDNODE_VMM_SUPERVISOR_FAILPOINTS');
    failpoints.set(FAILPOINTS.createAfterMounts);
    expect(failpoints.list()).toEqual(['runc.create.after-mounts=kill']);
    failpoints.set(`${FAILPOINTS.createAfterMounts}=error`);
    expect(() => failpoints.hit(FAILPOINTS.createAfterMounts)).toThrow(/failpoint runc.create.after-mounts/);
    expect(() => failpoints.set('runc.nope')).toThrow(/SANDNODE_VMM_SUPERVISOR_FAILPOINTS: unknown failpoint "runc.nope"/);
    expect(() => failpoints.set(`${FAILPOINTS.createAfterMounts}=hang`)).toThrow(/hang is only for/);
  });
});

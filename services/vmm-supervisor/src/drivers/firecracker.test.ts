import fs, { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { createLogger, isSameProcess, processStartTicks, processState } from '@sandnode/shared';
import type { VmRef } from '../core/driver';
import type { VmSpec } from '../core/types';
import { alive, FirecrackerDriver, vmmCommand } from './firecracker';
import { bootRequests, bootVm, FirecrackerApi, guestIpArg, guestMac, vmStateRequest } from './firecracker-api';
import type { BootPlan, FcRequest } from './firecracker-api';

const log = createLogger('vmm-supervisor-test', '0.0.0', 'silent');
const FAKE = path.resolve(__dirname, '..', '__tests__', 'fake-firecracker.cjs');

const plan: BootPlan = {
  kernelImage: '/k/vmlinux',
  kernelArgs: 'console=ttyS0 reboot=k panic=1 pci=off',
  rootfsImage: '/t/rootfs.ext4',
  upperDrive: '/dev/loop7',
  workspaceDrive: { path: '/dev/loop8', readOnly: false },
  vcpus: 2,
  memoryMib: 256,
  vsockPath: '/run/vms/vm-1/vsock.sock',
};

/** The exact boot sequence a VM gets, in order. */
const EXPECTED_BOOT: FcRequest[] = [
  { method: 'PUT', path: '/boot-source', body: { kernel_image_path: '/k/vmlinux', boot_args: 'console=ttyS0 reboot=k panic=1 pci=off' } },
  { method: 'PUT', path: '/drives/rootfs', body: { drive_id: 'rootfs', path_on_host: '/t/rootfs.ext4', is_root_device: true, is_read_only: true } },
  { method: 'PUT', path: '/drives/upper', body: { drive_id: 'upper', path_on_host: '/dev/loop7', is_root_device: false, is_read_only: false } },
  { method: 'PUT', path: '/drives/workspace', body: { drive_id: 'workspace', path_on_host: '/dev/loop8', is_root_device: false, is_read_only: false } },
  { method: 'PUT', path: '/machine-config', body: { vcpu_count: 2, mem_size_mib: 256 } },
  { method: 'PUT', path: '/vsock', body: { guest_cid: 3, uds_path: '/run/vms/vm-1/vsock.sock' } },
  { method: 'PUT', path: '/actions', body: { action_type: 'InstanceStart' } },
];

interface Seen {
  method: string;
  path: string;
  body: unknown;
  contentType: string | undefined;
}

/** fakeApi runs an HTTP server on a unix socket that records requests and answers with respond(). */
async function fakeApi(sock: string, respond: (r: Seen) => { status: number; body?: unknown } = () => ({ status: 204 })) {
  const seen: Seen[] = [];
  const server = http.createServer((req, res) => {
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString()));
    req.on('end', () => {
      const r: Seen = { method: req.method!, path: req.url!, body: text ? JSON.parse(text) : undefined, contentType: req.headers['content-type'] };
      seen.push(r);
      const out = respond(r);
      res.writeHead(out.status, out.body === undefined ? {} : { 'Content-Type': 'application/json' });
      res.end(out.body === undefined ? undefined : JSON.stringify(out.body));
    });
  });
  await new Promise<void>((resolve) => server.listen(sock, resolve));
  return { seen, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
}

describe('firecracker API requests', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'fc-api-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test('bootVm sends boot source, drives, machine config, vsock, InstanceStart in order with JSON bodies', async () => {
    const sock = path.join(dir, 'fc.sock');
    const api = await fakeApi(sock);
    try {
      await bootVm(new FirecrackerApi(sock), plan);
      expect(api.seen.map(({ method, path: p, body }) => ({ method, path: p, body }))).toEqual(EXPECTED_BOOT);
      expect(new Set(api.seen.map((s) => s.contentType))).toEqual(new Set(['application/json']));
    } finally {
      await api.close();
    }
  });

  test('no workspace drive: no /drives/workspace; a read-only workspace is attached read-only', () => {
    expect(bootRequests({ ...plan, workspaceDrive: undefined }).map((r) => r.path)).not.toContain('/drives/workspace');
    const ro = bootRequests({ ...plan, workspaceDrive: { path: '/dev/loop8', readOnly: true } }).find((r) => r.path === '/drives/workspace');
    expect(ro?.body).toMatchObject({ is_read_only: true });
  });

  test('a networked VM: guest eth0 on tap0 with a MAC from its address, its address in the kernel ip= argument, before vsock', () => {
    const reqs = bootRequests({ ...plan, network: { tap: 'tap0', address: '10.209.0.30', gateway: '10.209.0.29', prefixLen: 30 } });
    expect(reqs[0]!.body).toEqual({ kernel_image_path: '/k/vmlinux', boot_args: 'console=ttyS0 reboot=k panic=1 pci=off ip=10.209.0.30::10.209.0.29:255.255.255.252::eth0:off' });
    const paths = reqs.map((r) => r.path);
    expect(paths.indexOf('/network-interfaces/eth0')).toBe(paths.indexOf('/machine-config') + 1);
    expect(reqs.find((r) => r.path === '/network-interfaces/eth0')!.body).toEqual({ iface_id: 'eth0', host_dev_name: 'tap0', guest_mac: '06:00:0a:d1:00:1e' });
    expect(guestMac('192.168.255.1')).toBe('06:00:c0:a8:ff:01');
    expect(guestIpArg({ address: '10.1.0.2', gateway: '10.1.0.1', prefixLen: 24 })).toBe('ip=10.1.0.2::10.1.0.1:255.255.255.0::eth0:off');
    // without a network: no interface, boot args as configured
    expect(bootRequests(plan).map((r) => r.path)).not.toContain('/network-interfaces/eth0');
  });

  test('the VMM of a networked VM starts inside its slot netns (nsenter execs it: same pid)', () => {
    expect(vmmCommand('/bin/fc', ['--api-sock', '/s', '--id', 'vm-1'])).toEqual(['/bin/fc', ['--api-sock', '/s', '--id', 'vm-1']]);
    expect(vmmCommand('/bin/fc', ['--id', 'vm-1'], '/run/sandnode/netns/7')).toEqual(['nsenter', ['--net=/run/sandnode/netns/7', '--', '/bin/fc', '--id', 'vm-1']]);
  });

  test('pause/resume are PATCH /vm; GET / reads the state; an error status names the fault and stops the sequence', async () => {
    const sock = path.join(dir, 'fc.sock');
    const api = await fakeApi(sock, (r) => {
      if (r.method === 'GET') return { status: 200, body: { id: 'vm-1', state: 'Paused', vmm_version: '1.7.0' } };
      if (r.path === '/machine-config') return { status: 400, body: { fault_message: 'vcpu_count must be <= 32' } };
      return { status: 204 };
    });
    try {
      const c = new FirecrackerApi(sock);
      await c.call(vmStateRequest('Paused'));
      await c.call(vmStateRequest('Resumed'));
      expect(await c.state()).toBe('Paused');
      expect(api.seen.map(({ method, path: p, body }) => ({ method, path: p, body }))).toEqual([
        { method: 'PATCH', path: '/vm', body: { state: 'Paused' } },
        { method: 'PATCH', path: '/vm', body: { state: 'Resumed' } },
        { method: 'GET', path: '/', body: undefined },
      ]);
      api.seen.length = 0;
      await expect(bootVm(c, plan)).rejects.toThrow('firecracker API PUT /machine-config: HTTP 400: vcpu_count must be <= 32');
      expect(api.seen.map((s) => s.path)).toEqual(['/boot-source', '/drives/rootfs', '/drives/upper', '/drives/workspace', '/machine-config']);
    } finally {
      await api.close();
    }
  });

  test('a socket nobody serves is an InternalError naming the socket', async () => {
    await expect(new FirecrackerApi(path.join(dir, 'none.sock')).state()).rejects.toThrow(/GET \/ on .*none\.sock/);
  });
});

/** fakeVmmPids lists live (non-zombie) fake VMM processes with an argument that starts with prefix (an API socket or a dir). */
function fakeVmmPids(prefix: string): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const argv = readFileSync(`/proc/${name}/cmdline`, 'utf8').split('\0');
      if (argv.some((a) => a.endsWith('fake-firecracker.cjs')) && argv.some((a) => a.startsWith(prefix)) && processState(Number(name)) !== 'Z') out.push(Number(name));
    } catch {
      /* gone */
    }
  }
  return out;
}

describe('FirecrackerDriver with a fake firecracker binary', () => {
  let dir: string;
  let reqLog: string;
  let driver: FirecrackerDriver;
  /** The fake VMMs' environment (jest's process.env does not reach child processes). */
  const env: NodeJS.ProcessEnv = { ...process.env };
  const spec: VmSpec = {
    templateRootfs: '/t/rootfs.ext4',
    drives: [
      { driveId: 'up', path: '/dev/loop7', role: 'rootfs-upper', readOnly: false },
      { driveId: 'ws', path: '/dev/loop8', role: 'workspace', readOnly: true },
    ],
    resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 },
    poddSocketDir: '/p',
    hostname: '',
    env: {},
  };
  const requests = (id: string) =>
    readFileSync(reqLog, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { id: string; method: string; path: string; body: unknown })
      .filter((r) => r.id === id)
      .map(({ method, path: p, body }) => ({ method, path: p, body }));

  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'fc-drv-'));
    reqLog = path.join(dir, 'requests.jsonl');
    env.FAKE_FC_LOG = reqLog;
    driver = new FirecrackerDriver({ firecrackerBinary: FAKE, kernelImage: '/k/vmlinux', kernelArgs: 'console=ttyS0', runDir: path.join(dir, 'run'), log, env });
  });
  afterAll(() => {
    for (const pid of fakeVmmPids(dir)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    rmSync(dir, { recursive: true, force: true });
  });

  const ref = (vmId: string, s: { process: { pid: number; startTimeTicks: number }; apiSocket: string }): VmRef => ({
    vmId,
    process: s.process,
    apiSocket: s.apiSocket,
    binary: FAKE,
  });

  test('version parses "Firecracker v1.7.0"', async () => {
    expect(await driver.version()).toBe('1.7.0');
    expect(driver.configuredBinary()).toBe(FAKE);
  });

  test('create spawns a detached VMM, configures it over fc.sock, and records the API socket', async () => {
    const s = await driver.create('vm-1', spec, { vcpus: 1, memoryMib: 128, pids: 1024 });
    expect(s.apiSocket).toBe(path.join(dir, 'run', 'vms', 'vm-1', 'fc.sock'));
    expect(isSameProcess(s.process.pid, s.process.startTimeTicks)).toBe(true);
    // Own session and process group: survives the supervisor.
    const stat = readFileSync(`/proc/${s.process.pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    expect(Number(f[2])).toBe(s.process.pid); // pgrp
    expect(Number(f[3])).toBe(s.process.pid); // session
    expect(requests('vm-1')).toEqual([
      { method: 'PUT', path: '/boot-source', body: { kernel_image_path: '/k/vmlinux', boot_args: 'console=ttyS0' } },
      { method: 'PUT', path: '/drives/rootfs', body: { drive_id: 'rootfs', path_on_host: '/t/rootfs.ext4', is_root_device: true, is_read_only: true } },
      { method: 'PUT', path: '/drives/upper', body: { drive_id: 'upper', path_on_host: '/dev/loop7', is_root_device: false, is_read_only: false } },
      { method: 'PUT', path: '/drives/workspace', body: { drive_id: 'workspace', path_on_host: '/dev/loop8', is_root_device: false, is_read_only: true } },
      { method: 'PUT', path: '/machine-config', body: { vcpu_count: 1, mem_size_mib: 128 } },
      { method: 'PUT', path: '/vsock', body: { guest_cid: 3, uds_path: path.join(dir, 'run', 'vms', 'vm-1', 'vsock.sock') } },
      { method: 'PUT', path: '/actions', body: { action_type: 'InstanceStart' } },
    ]);

    const vm = ref('vm-1', s);
    expect(await driver.inspect(vm)).toEqual({ state: 'running', process: s.process });
    await driver.pause(vm);
    expect(await driver.inspect(vm)).toEqual({ state: 'paused', process: s.process });
    await driver.resume(vm);
    expect(await driver.inspect(vm)).toEqual({ state: 'running', process: s.process });
    // A reused pid (other start ticks) is never adopted.
    expect((await driver.inspect({ ...vm, process: { pid: s.process.pid, startTimeTicks: 1 } })).state).toBe('stopped');

    await driver.stop(vm, 2000);
    expect(requests('vm-1').slice(-2)).toEqual([
      { method: 'GET', path: '/', body: undefined },
      { method: 'PUT', path: '/actions', body: { action_type: 'SendCtrlAltDel' } },
    ]);
    expect(isSameProcess(s.process.pid, s.process.startTimeTicks) && processState(s.process.pid) !== 'Z').toBe(false);
    expect((await driver.inspect(vm)).state).toBe('stopped');
    await driver.destroy(vm);
    expect(existsSync(driver.vmDir('vm-1'))).toBe(false);
  });

  test('issue 11: the API socket a row names is never connected to; the VM is driven on its own fc.sock', async () => {
    const s = await driver.create('vm-9', spec, { vcpus: 1, memoryMib: 128, pids: 1024 });
    const foreign = path.join(dir, 'foreign.sock');
    let connections = 0;
    const srv = net.createServer((c) => {
      connections++;
      c.destroy();
    });
    await new Promise<void>((resolve) => srv.listen(foreign, resolve));
    try {
      const vm = ref('vm-9', { process: s.process, apiSocket: foreign });
      await driver.pause(vm);
      expect(await driver.inspect(vm)).toEqual({ state: 'paused', process: s.process });
      await driver.destroy(vm);
      expect(connections).toBe(0);
    } finally {
      await new Promise<void>((resolve) => srv.close(() => resolve()));
    }
  });

  test('a guest that ignores Ctrl-Alt-Del gets SIGKILL after the timeout; a paused one at once', async () => {
    env.FAKE_FC_IGNORE_CAD = '1';
    try {
      const a = await driver.create('vm-2', spec, { vcpus: 1, memoryMib: 128, pids: 1024 });
      const t0 = Date.now();
      await driver.stop(ref('vm-2', a), 300);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
      expect((await driver.inspect(ref('vm-2', a))).state).toBe('stopped');

      const b = await driver.create('vm-3', spec, { vcpus: 1, memoryMib: 128, pids: 1024 });
      await driver.pause(ref('vm-3', b));
      await driver.stop(ref('vm-3', b), 10_000);
      expect(requests('vm-3').map((r) => r.body)).not.toContainEqual({ action_type: 'SendCtrlAltDel' });
      expect((await driver.inspect(ref('vm-3', b))).state).toBe('stopped');
    } finally {
      delete env.FAKE_FC_IGNORE_CAD;
    }
  });

  test('a failed configuration step is undone: VMM killed, dir removed, error names the step', async () => {
    env.FAKE_FC_FAIL_PATH = '/vsock';
    try {
      await expect(driver.create('vm-4', spec, { vcpus: 1, memoryMib: 128, pids: 1024 })).rejects.toThrow(
        /create vm vm-4: configure and start over the API failed: firecracker API PUT \/vsock: HTTP 400: injected failure/,
      );
      expect(existsSync(driver.vmDir('vm-4'))).toBe(false);
      expect(requests('vm-4').map((r) => r.path)).toContain('/vsock');
      expect(fakeVmmPids(driver.apiSocketPath('vm-4'))).toEqual([]);
    } finally {
      delete env.FAKE_FC_FAIL_PATH;
    }
  });

  test('destroy of a VM the table forgot kills the VMM named in firecracker.pid', async () => {
    const s = await driver.create('vm-5', spec, { vcpus: 1, memoryMib: 128, pids: 1024 });
    await driver.destroy({ vmId: 'vm-5', process: { pid: 0, startTimeTicks: 0 }, apiSocket: '', binary: '' });
    expect(isSameProcess(s.process.pid, s.process.startTimeTicks) && processState(s.process.pid) !== 'Z').toBe(false);
    expect(existsSync(driver.vmDir('vm-5'))).toBe(false);
  });
});

describe('alive (the VMM process check)', () => {
  test('a /proc read that fails with EMFILE is not "gone"; a reused pid and pid 0 are', () => {
    const ticks = processStartTicks(process.pid)!;
    expect(alive({ pid: process.pid, startTimeTicks: ticks })).toBe(true);
    expect(alive({ pid: process.pid, startTimeTicks: ticks + 1 })).toBe(false);
    expect(alive({ pid: 0, startTimeTicks: ticks })).toBe(false);
    const real = fs.readFileSync;
    const spy = jest.spyOn(fs, 'readFileSync').mockImplementation(((f: fs.PathOrFileDescriptor, o?: unknown) => {
      if (f === `/proc/${process.pid}/stat`) throw Object.assign(new Error('EMFILE: too many open files'), { code: 'EMFILE' });
      return (real as (f: fs.PathOrFileDescriptor, o?: unknown) => string | Buffer)(f, o);
    }) as typeof fs.readFileSync);
    try {
      expect(alive({ pid: process.pid, startTimeTicks: ticks })).toBe(true);
    } finally {
      spy.mockRestore();
    }
  });
});

/**
 * ForkSandbox and ResetRootfs on a real node: runc containers on loop devices, podd's bounded
 * quiesce through the supervisor's freeze port, CloneDevice in the ublk-manager, SQLite
 * records; every service a separate process on unix sockets. Also a ublk-manager killed in the
 * middle of a clone (its failpoint ublk.clone.after-copy).
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { ForkMethod, SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { PoddServiceDefinition, ThawEndedBy } from '@sandnode/shared/proto/podd/v1/podd';
import type { ServerApi } from '@sandnode/shared';
import { sandnodeProcesses, startComponent } from '@sandnode/node-stack';
import { describeNode, execCollect, expectCode, holderStatus, inventory, killProcesses, orphans, serverProcesses, startNode, waitFor, withEnv, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

/** Freeze bound the issue sets: the parent's window never exceeds max_freeze_ms + 100 ms. */
const SLACK_MS = 100;

function frozen(pid: number): boolean {
  const cg = readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .split('\n')
    .find((l) => l.includes(':freezer:'));
  if (!cg) return false;
  return readFileSync(`/sys/fs/cgroup/freezer${cg.split(':')[2] ?? ''}/freezer.state`, 'utf8').trim() === 'FROZEN';
}

async function sh(api: ServerApi, id: string, script: string): Promise<string> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  if (r.exitCode !== 0) throw new Error(`${script}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}

/** readAll reads a whole /workspace file through the API (3 MiB chunks). */
async function readAll(api: ServerApi, id: string, path: string): Promise<Buffer> {
  const parts: Buffer[] = [];
  let offset = 0;
  for (;;) {
    const r = await api.sandboxes.readFile({ sandboxId: id, path, offset, length: 0 });
    parts.push(Buffer.from(r.data));
    offset += r.data.length;
    if (r.eof || r.data.length === 0) return Buffer.concat(parts);
  }
}

/** devicesOf returns the ublk-manager's devices of a sandbox, by id. */
async function devicesOf(node: TestNode, id: string): Promise<Map<string, string>> {
  const ch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'ublk-manager')));
  try {
    const all = (await createServiceClient(DeviceServiceDefinition, ch, { timeoutMs: 5000 }).listDevices({})).devices;
    return new Map(all.filter((d) => d.deviceId.startsWith(`${id}-`)).map((d) => [d.deviceId, d.backingFile]));
  } finally {
    ch.close();
  }
}

/** stopVm removes a sandbox's VM through the supervisor (its filesystems unmounted, devices kept), at the node's epoch. */
async function stopVm(node: TestNode, id: string): Promise<void> {
  const epoch = (await holderStatus(node.dirs))?.epoch;
  if (epoch === undefined) throw new Error('no active server holds the lease');
  const ch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
  try {
    await createServiceClient(VmServiceDefinition, ch, { timeoutMs: 30_000, epoch: () => epoch }).deleteVm({ vmId: id });
  } finally {
    ch.close();
  }
}

async function expectNoOrphans(node: TestNode): Promise<void> {
  const list = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
  const live = list.filter((s) => s.state === SandboxState.SANDBOX_STATE_RUNNING || s.state === SandboxState.SANDBOX_STATE_PAUSED).map((s) => s.sandboxId);
  expect(
    orphans(
      await inventory(node.dirs),
      live,
      list.map((s) => s.sandboxId),
    ),
  ).toEqual([]);
}

describeNode('ForkSandbox and ResetRootfs on a real node', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('forks a RUNNING sandbox by quiesce: the child has its clones and its own identity, and the two are isolated', async () => {
    const { api } = node;
    const parent = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const pid = parent.sandboxId;
    await api.sandboxes.writeFile({ sandboxId: pid, path: 'a.txt', data: Buffer.from('from parent') });
    await sh(api, pid, 'echo root-layer > /etc/marker');
    const parentMachineId = (await sh(api, pid, 'cat /etc/machine-id')).trim();
    expect(parentMachineId).toMatch(/^[0-9a-f]{32}$/);

    const r = await api.sandboxes.forkSandbox({ parentId: pid, metadata: { role: 'child' }, maxFreezeMs: 1000 });
    const child = r.sandbox!;
    expect(r.method).toBe(ForkMethod.FORK_METHOD_QUIESCE);
    expect(r.parentHeldMs).toBeGreaterThan(0);
    expect(r.parentHeldMs).toBeLessThanOrEqual(1000 + SLACK_MS);
    expect(child.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(child.forkedFrom).toBe(pid);
    expect(child.rootfsGeneration).toBe(1);
    expect(child.metadata).toEqual({ role: 'child' });
    expect(child.sandboxId).not.toBe(pid);
    expect(child.pid).not.toBe(parent.pid);

    // the parent ran on: same process, RUNNING, not frozen
    const p2 = (await api.sandboxes.getSandbox({ sandboxId: pid })).sandbox!;
    expect(p2.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(p2.pid).toBe(parent.pid);
    expect(frozen(parent.pid)).toBe(false);

    const cid = child.sandboxId;
    expect((await readAll(api, cid, 'a.txt')).toString()).toBe('from parent');
    expect(await sh(api, cid, 'cat /etc/marker')).toBe('root-layer\n');
    expect(await sh(api, cid, 'hostname')).toBe(`${cid}\n`);
    const childMachineId = (await sh(api, cid, 'cat /etc/machine-id')).trim();
    expect(childMachineId).toMatch(/^[0-9a-f]{32}$/);
    expect(childMachineId).not.toBe(parentMachineId);
    expect(await sh(api, cid, 'echo $SANDNODE_FORKED_FROM')).toBe(`${pid}\n`);

    // isolation, both ways, both layers
    await api.sandboxes.writeFile({ sandboxId: cid, path: 'a.txt', data: Buffer.from('from child') });
    await sh(api, pid, 'echo parent-after > /etc/marker; echo new > /workspace/b.txt');
    expect((await readAll(api, pid, 'a.txt')).toString()).toBe('from parent');
    expect(await sh(api, cid, 'cat /etc/marker')).toBe('root-layer\n');
    expect((await execCollect(api, cid, ['cat', '/workspace/b.txt'])).exitCode).not.toBe(0);

    // the child's devices are clones of the parent's
    const devs = await devicesOf(node, cid);
    expect([...devs.keys()].sort()).toEqual([`${cid}-upper`, `${cid}-ws`]);

    await api.sandboxes.deleteSandbox({ sandboxId: cid });
    // the parent is untouched by its child's delete
    expect((await readAll(api, pid, 'a.txt')).toString()).toBe('from parent');
    await api.sandboxes.deleteSandbox({ sandboxId: pid });
    await expectNoOrphans(node);
  });

  it('a sandbox cannot freeze itself: FreezeFilesystems from inside on its freeze port is FAILED_PRECONDITION (the server arms only its forks), it stays writable, and a fork after it still quiesces', async () => {
    const { api } = node;
    const id = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    // a raw gRPC call from a process in the sandbox: FreezeFilesystems { max_freeze_ms: 2000 }
    const attack =
      "const h=require('http2'),net=require('net');const c=h.connect('http://x',{createConnection:()=>net.connect('/run/sandnode-freeze/freeze.sock')});" +
      "const s=c.request({':method':'POST',':path':'/sandnode.vmm.v1.FreezePortService/FreezeFilesystems','content-type':'application/grpc',te:'trailers'});" +
      "let st='none';const t=(x)=>{if(x['grpc-status']!==undefined)st=x['grpc-status']};s.on('response',t);s.on('trailers',t);s.on('data',()=>{});" +
      "s.on('close',()=>{console.log(st);c.close()});s.end(Buffer.from([0,0,0,0,3,8,0xd0,0x0f]));";
    const r = await execCollect(api, id, ['node', '-e', attack]);
    expect({ exitCode: r.exitCode, status: r.stdout.trim() }).toEqual({ exitCode: 0, status: String(Status.FAILED_PRECONDITION) });
    // nothing is frozen: a write inside finishes
    expect(await sh(api, id, 'echo still-writable > /workspace/w.txt && cat /workspace/w.txt')).toBe('still-writable\n');
    const f = await api.sandboxes.forkSandbox({ parentId: id, maxFreezeMs: 1000 });
    expect(f.method).toBe(ForkMethod.FORK_METHOD_QUIESCE);
    expect((await readAll(api, f.sandbox!.sandboxId, 'w.txt')).toString()).toBe('still-writable\n');
    await api.sandboxes.deleteSandbox({ sandboxId: f.sandbox!.sandboxId });
    await api.sandboxes.deleteSandbox({ sandboxId: id });
  });

  it('forks a PAUSED sandbox as it is; the parent stays PAUSED and frozen', async () => {
    const { api } = node;
    const parent = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await api.sandboxes.writeFile({ sandboxId: parent.sandboxId, path: 'p.txt', data: Buffer.from('paused parent') });
    // written without fsync right before the pause: still dirty in the page cache, not on the devices
    await sh(api, parent.sandboxId, 'echo last > /workspace/last.txt; echo last > /etc/last.txt');
    await api.sandboxes.pauseSandbox({ sandboxId: parent.sandboxId });
    const r = await api.sandboxes.forkSandbox({ parentId: parent.sandboxId });
    expect(r.method).toBe(ForkMethod.FORK_METHOD_PAUSED_PARENT);
    expect(r.parentHeldMs).toBe(0);
    expect((await api.sandboxes.getSandbox({ sandboxId: parent.sandboxId })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_PAUSED);
    expect(frozen(parent.pid)).toBe(true);
    expect((await readAll(api, r.sandbox!.sandboxId, 'p.txt')).toString()).toBe('paused parent');
    expect(await sh(api, r.sandbox!.sandboxId, 'cat /workspace/last.txt /etc/last.txt')).toBe('last\nlast\n');
    await api.sandboxes.deleteSandbox({ sandboxId: r.sandbox!.sandboxId });
    await api.sandboxes.deleteSandbox({ sandboxId: parent.sandboxId });
  });

  it('20 forks during an fsync writer: every child holds a prefix of the parent with no torn line, and e2fsck finds each child image clean', async () => {
    const { api } = node;
    const parent = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const pid = parent.sandboxId;
    const writer = new AbortController();
    const script =
      "const fs=require('fs');const fd=fs.openSync('/workspace/seq.txt','a');" + "for(let i=1;;i++){fs.writeSync(fd,'line '+String(i).padStart(8,'0')+' '+'x'.repeat(40)+'\\n');fs.fsyncSync(fd);}";
    const writing = (async () => {
      try {
        for await (const _ of api.sandboxes.exec({ sandboxId: pid, argv: ['node', '-e', script], env: {}, cwd: '', stdin: Buffer.alloc(0), timeoutMs: 0 }, { signal: writer.signal })) {
          /* runs until aborted */
        }
      } catch {
        /* aborted */
      }
    })();
    // wait until the writer writes
    await waitFor('the writer to write', async () => (await execCollect(api, pid, ['sh', '-c', 'test -s /workspace/seq.txt'])).exitCode === 0, 10_000, 25);

    const LINE = /^line (\d{8}) x{40}$/;
    const children: { id: string; text: string }[] = [];
    let lastCount = 0;
    try {
      for (let n = 0; n < 20; n++) {
        const r = await api.sandboxes.forkSandbox({ parentId: pid, maxFreezeMs: 1500 });
        expect(r.method).toBe(ForkMethod.FORK_METHOD_QUIESCE);
        expect(r.parentHeldMs).toBeLessThanOrEqual(1500 + SLACK_MS);
        const cid = r.sandbox!.sandboxId;
        const text = (await readAll(api, cid, 'seq.txt')).toString();
        expect(text.endsWith('\n')).toBe(true); // no torn last line
        const lines = text.slice(0, -1).split('\n');
        lines.forEach((l, i) => {
          const m = LINE.exec(l);
          expect(m?.[1]).toBe(String(i + 1).padStart(8, '0'));
        });
        expect(lines.length).toBeGreaterThanOrEqual(lastCount); // later forks see more
        lastCount = lines.length;
        children.push({ id: cid, text });
      }
    } finally {
      writer.abort();
      await writing;
    }
    const whole = (await readAll(api, pid, 'seq.txt')).toString();
    for (const c of children) {
      expect(whole.startsWith(c.text)).toBe(true);
      // unmount the child's filesystems (its VM goes; its devices stay) and check both images
      const devs = await devicesOf(node, c.id);
      await stopVm(node, c.id);
      for (const [devId, image] of devs) {
        const fsck = spawnSync('e2fsck', ['-fn', image], { encoding: 'utf8' });
        expect({ devId, status: fsck.status, out: fsck.stdout + fsck.stderr }).toMatchObject({ devId, status: 0 });
      }
      await api.sandboxes.deleteSandbox({ sandboxId: c.id });
    }
    await api.sandboxes.deleteSandbox({ sandboxId: pid });
    await expectNoOrphans(node);
  });

  it('ResetRootfs gives a fresh rootfs from the template and keeps /workspace; a fork after it clones the current generation', async () => {
    const { api } = node;
    const s = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const id = s.sandboxId;
    await sh(api, id, 'echo gen1 > /etc/gen1; echo kept > /workspace/keep.txt');
    const r = (await api.sandboxes.resetRootfs({ sandboxId: id })).sandbox!;
    expect(r.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(r.rootfsGeneration).toBe(2);
    expect(r.pid).not.toBe(s.pid);
    expect((await execCollect(api, id, ['cat', '/etc/gen1'])).exitCode).not.toBe(0);
    expect(await sh(api, id, 'cat /workspace/keep.txt')).toBe('kept\n');
    expect(await sh(api, id, 'test -x /sbin/sandnode-init && echo template')).toBe('template\n');
    expect([...(await devicesOf(node, id)).keys()].sort()).toEqual([`${id}-upper-g2`, `${id}-ws`]);

    await sh(api, id, 'echo gen2 > /etc/gen2');
    const f = await api.sandboxes.forkSandbox({ parentId: id });
    const cid = f.sandbox!.sandboxId;
    expect(f.sandbox!.rootfsGeneration).toBe(2);
    expect(await sh(api, cid, 'cat /etc/gen2')).toBe('gen2\n');
    expect((await execCollect(api, cid, ['cat', '/etc/gen1'])).exitCode).not.toBe(0);
    expect(await sh(api, cid, 'cat /workspace/keep.txt')).toBe('kept\n');

    // a paused sandbox can be reset too and comes back RUNNING
    await api.sandboxes.pauseSandbox({ sandboxId: id });
    const r3 = (await api.sandboxes.resetRootfs({ sandboxId: id })).sandbox!;
    expect(r3.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(r3.rootfsGeneration).toBe(3);
    expect((await execCollect(api, id, ['cat', '/etc/gen2'])).exitCode).not.toBe(0);

    await api.sandboxes.deleteSandbox({ sandboxId: cid });
    await api.sandboxes.deleteSandbox({ sandboxId: id });
    await expectNoOrphans(node);
  });

  it('refuses bad fork and reset requests with a clear status and changes nothing', async () => {
    const { api } = node;
    const s = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const before = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.length;
    const cases: [string, Promise<unknown>, Status][] = [
      ['malformed parent id', api.sandboxes.forkSandbox({ parentId: 'nope' }), Status.INVALID_ARGUMENT],
      ['unknown parent', api.sandboxes.forkSandbox({ parentId: 'sb-0000000000000000' }), Status.NOT_FOUND],
      ['max_freeze_ms above 5000', api.sandboxes.forkSandbox({ parentId: s.sandboxId, maxFreezeMs: 5001 }), Status.INVALID_ARGUMENT],
      ['bad metadata key', api.sandboxes.forkSandbox({ parentId: s.sandboxId, metadata: { 'bad key': 'x' } }), Status.INVALID_ARGUMENT],
      ['timeout above 30 days', api.sandboxes.forkSandbox({ parentId: s.sandboxId, timeoutSeconds: 2_592_001 }), Status.INVALID_ARGUMENT],
      ['bad request id', api.sandboxes.forkSandbox({ parentId: s.sandboxId, requestId: 'a b' }), Status.INVALID_ARGUMENT],
      ['reset of unknown sandbox', api.sandboxes.resetRootfs({ sandboxId: 'sb-0000000000000000' }), Status.NOT_FOUND],
      ['reset with malformed id', api.sandboxes.resetRootfs({ sandboxId: '../x' }), Status.INVALID_ARGUMENT],
    ];
    for (const [name, p, code] of cases) {
      await expectCode(p, code).catch((e: Error) => {
        throw new Error(`${name}: ${e.message}`, { cause: e });
      });
    }
    expect((await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.length).toBe(before);

    // a request_id names one fork: a retry returns the same child
    const a = await api.sandboxes.forkSandbox({ parentId: s.sandboxId, requestId: 'fork-once' });
    const b = await api.sandboxes.forkSandbox({ parentId: s.sandboxId, requestId: 'fork-once' });
    expect(b.sandbox!.sandboxId).toBe(a.sandbox!.sandboxId);
    await expect(api.sandboxes.forkSandbox({ parentId: a.sandbox!.sandboxId, requestId: 'fork-once' })).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT });
    await api.sandboxes.deleteSandbox({ sandboxId: a.sandbox!.sandboxId });
    await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
    await expectNoOrphans(node);
  });

  it('the CLI forks and resets', async () => {
    const created = node.cli(['sandbox', 'create', '--json']);
    expect(created.status).toBe(0);
    const id = (JSON.parse(created.stdout) as { id: string }).id;
    const forked = node.cli(['sandbox', 'fork', id, '--json', '--metadata', 'k=v']);
    expect(forked.stderr).toBe('');
    const f = JSON.parse(forked.stdout) as { id: string; forked_from: string; metadata: Record<string, string>; fork: { method: string; parent_held_ms: number } };
    expect(f).toMatchObject({ forked_from: id, metadata: { k: 'v' }, fork: { method: 'quiesce' } });
    const reset = node.cli(['sandbox', 'reset-rootfs', f.id]);
    expect(reset.status).toBe(0);
    expect(reset.stdout).toMatch(new RegExp(`^${f.id} RUNNING pid \\d+ rootfs generation 2\\n$`));
    expect(node.cli(['sandbox', 'delete', f.id, id]).status).toBe(0);
  });
});

describeNode('a server killed mid-fork or mid-reset', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** poddFreezeStatus asks a sandbox's podd directly, after its freeze window has surely ended. */
  async function poddFreezeStatus(id: string) {
    const ch = createSandnodeChannel(unixAddress(path.join(node.dirs.runDir, 'sandboxes', id, 'podd.sock')));
    try {
      const client = createServiceClient(PoddServiceDefinition, ch, { timeoutMs: 5000 });
      return await waitFor(
        `podd of ${id} to be thawed`,
        async () => {
          const st = await client.getFreezeStatus({});
          return st.frozen ? undefined : st;
        },
        10_000,
        50,
      );
    } finally {
      ch.close();
    }
  }

  /** restartServer kills the server (it may be dead already) and starts it again without failpoints. */
  async function restartServer(): Promise<void> {
    await killProcesses(serverProcesses(node.dirs.runDir), 0);
    await withEnv({ SANDNODE_SERVER_FAILPOINTS: '' }, () => startComponent(node.dirs, 'server', { timeoutMs: 60_000 }));
    node.reconnect();
  }

  /** withFailpoint restarts the server with one failpoint set. */
  async function withFailpoint(fp: string): Promise<void> {
    await killProcesses(serverProcesses(node.dirs.runDir), 0);
    await withEnv({ SANDNODE_SERVER_FAILPOINTS: `${fp}=kill` }, () => startComponent(node.dirs, 'server', { timeoutMs: 60_000 }));
    node.reconnect();
  }

  it('a kill after the parent was frozen: the watchdog thaws the parent within its window, adoption removes the half-made child', async () => {
    const parent = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await withFailpoint('fork.after-hold');
    await expect(node.api.sandboxes.forkSandbox({ parentId: parent.sandboxId, maxFreezeMs: 400 })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    // podd's watchdog ended the freeze, within the window
    const st = await poddFreezeStatus(parent.sandboxId);
    expect(st).toMatchObject({ frozen: false, endedBy: ThawEndedBy.THAW_ENDED_BY_WATCHDOG });
    expect(st.frozenMs).toBeLessThanOrEqual(400 + SLACK_MS);
    await restartServer();
    const api = node.api;
    // writable again: the write completes (it would block while frozen)
    await sh(api, parent.sandboxId, 'echo thawed > /workspace/after.txt; sync');
    const list = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(list.map((s) => s.sandboxId)).toEqual([parent.sandboxId]);
    expect(list[0]!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(list[0]!.pid).toBe(parent.pid);
    await expectNoOrphans(node);
    await api.sandboxes.deleteSandbox({ sandboxId: parent.sandboxId });
  });

  it('a kill after the clones: no child survives, nothing is orphaned', async () => {
    const parent = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await withFailpoint('fork.after-clone');
    await expect(node.api.sandboxes.forkSandbox({ parentId: parent.sandboxId, maxFreezeMs: 5000 })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    await restartServer();
    await sh(node.api, parent.sandboxId, 'echo thawed > /workspace/after.txt; sync');
    const list = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(list.map((s) => s.sandboxId)).toEqual([parent.sandboxId]);
    await expectNoOrphans(node);
    await node.api.sandboxes.deleteSandbox({ sandboxId: parent.sandboxId });
  });

  it('a kill in ResetRootfs after the VM stopped: adoption finishes the reset (DRAINED on the new rootfs) and ResumeSandbox boots it', async () => {
    const s = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await sh(node.api, s.sandboxId, 'echo old > /etc/old; echo kept > /workspace/keep.txt');
    await withFailpoint('reset.after-stop');
    await expect(node.api.sandboxes.resetRootfs({ sandboxId: s.sandboxId })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    await restartServer();
    const got = (await node.api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
    expect(got.state).toBe(SandboxState.SANDBOX_STATE_DRAINED);
    expect(got.rootfsGeneration).toBe(2);
    const back = (await node.api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId })).sandbox!;
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect((await execCollect(node.api, s.sandboxId, ['cat', '/etc/old'])).exitCode).not.toBe(0);
    expect(await sh(node.api, s.sandboxId, 'cat /workspace/keep.txt')).toBe('kept\n');
    await expectNoOrphans(node);
    await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  /** restartUblkManager SIGKILLs the ublk-manager and starts it again with env (its devices stay attached). */
  async function restartUblkManager(env: Record<string, string>): Promise<void> {
    const pids = sandnodeProcesses(node.dirs.runDir)
      .filter((p) => /services\/ublk-manager\/dist\/main\.js/.test(p.cmd))
      .map((p) => p.pid);
    await killProcesses(pids, 0);
    await withEnv(env, () => startComponent(node.dirs, 'ublk-manager', { timeoutMs: 60_000 }));
  }

  it('the ublk-manager killed mid-clone: UNAVAILABLE naming ublk-manager (not the freeze advice), the parent thawed, the child undone once it is back', async () => {
    const parent = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await restartUblkManager({ SANDNODE_UBLK_MANAGER_FAILPOINTS: 'ublk.clone.after-copy=kill' });
    try {
      const err = await node.api.sandboxes.forkSandbox({ parentId: parent.sandboxId, maxFreezeMs: 1500 }).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: Status.UNAVAILABLE });
      expect((err as Error).message).toMatch(/ublk-manager is unavailable/);
      expect((err as Error).message).not.toMatch(/freeze|\.sock/);
      // thawed: a write completes (it would block while frozen)
      await sh(node.api, parent.sandboxId, 'echo thawed > /workspace/after-ublk.txt; sync');
    } finally {
      await restartUblkManager({ SANDNODE_UBLK_MANAGER_FAILPOINTS: '' });
    }
    // the child's teardown is finished by the reaper once the manager is back
    await waitFor('the half-made child to be torn down', async () => (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.length === 1, 60_000, 200);
    const list = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(list.map((x) => [x.sandboxId, x.state])).toEqual([[parent.sandboxId, SandboxState.SANDBOX_STATE_RUNNING]]);
    await waitFor('no orphaned device or dir', async () => orphans(await inventory(node.dirs), [parent.sandboxId], [parent.sandboxId]).length === 0, 30_000, 200).catch(() => undefined);
    await expectNoOrphans(node);
    await node.api.sandboxes.deleteSandbox({ sandboxId: parent.sandboxId });
  });
});

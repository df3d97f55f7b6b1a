/**
 * Attack (issue 10 §2): what a hostile runc sandbox can do with the host-side files it writes
 * and with podd. /run/sandnode is a tmpfs of its own (16 MiB), so filling it stops at ENOSPC and
 * never reaches the host's disk; init's stdout/stderr go to a console log the supervisor keeps
 * at most 1 MiB of, also while the supervisor is killed and restarted during a flood; truncating
 * it changes nothing for the host; and a podd the sandbox replaced (answering lies on podd's
 * socket) cannot make a fork take a torn copy of an unfrozen parent.
 */
import { existsSync, readFileSync, statfsSync, statSync } from 'node:fs';
import path from 'node:path';
import { findRunning, startComponent } from '@sandnode/node-stack';
import type { ServerApi } from '@sandnode/shared';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, execCollect, expectCode, startNode, waitFor, withEnv, type TestNode } from '@sandnode/testkit';
import { Status } from 'nice-grpc-common';

jest.setTimeout(300_000);

const MIB = 1024 * 1024;
/** statfs f_type of tmpfs */
const TMPFS_MAGIC = 0x01021994;
/** the supervisor's defaults: guestRunDirBytes, consoleLogBytes */
const GUEST_BYTES = 16 * MIB;
const CONSOLE_CAP = MIB;

async function run(api: ServerApi, id: string, script: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
}

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** mountOptionsOf: the per-mount options of the top mount at dir ([] if none). */
function mountOptionsOf(dir: string): string[] {
  let opts: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ');
    if (f[4] === dir) opts = (f[5] ?? '').split(',');
  }
  return opts;
}

/**
 * A podd a sandbox wrote itself: it serves podd's listening socket (fd 3, which the init hands
 * to every podd it starts) over plain HTTP/2 and answers lies: healthy, "podd.quiesce", a
 * Quiesce that freezes nothing (empty token, a 5000 ms window), a Thaw "ended by the caller".
 */
const LYING_PODD = String.raw`
const http2 = require('http2');
const fs = require('fs');
const varint = (n) => { const o = []; while (n > 127) { o.push((n & 127) | 128); n = Math.floor(n / 128); } o.push(n); return Buffer.from(o); };
const str = (no, s) => { const b = Buffer.from(s); return Buffer.concat([Buffer.from([(no << 3) | 2]), varint(b.length), b]); };
const num = (no, n) => Buffer.concat([Buffer.from([no << 3]), varint(n)]);
const answers = {
  '/sandnode.podd.v1.PoddService/Health': num(1, 1),
  '/sandnode.common.v1.VersionService/GetVersion': Buffer.concat([str(1, 'podd'), str(2, '9.9.9'), str(4, 'podd.quiesce')]),
  '/sandnode.podd.v1.PoddService/Quiesce': num(2, 5000),
  '/sandnode.podd.v1.PoddService/Thaw': Buffer.concat([num(1, 1), num(2, 1)]),
};
const server = http2.createServer();
server.on('stream', (stream, headers) => {
  const p = headers[':path'];
  fs.appendFileSync('/run/sandnode/liar.log', p + '\n');
  stream.on('data', () => {});
  stream.on('end', () => {
    const msg = answers[p];
    if (!msg) return stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '12' }, { endStream: true });
    stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
    const head = Buffer.alloc(5);
    head.writeUInt32BE(msg.length, 1);
    stream.end(Buffer.concat([head, msg]));
  });
});
server.listen({ fd: 3 }, () => fs.appendFileSync('/run/sandnode/liar.log', 'up\n'));
`;

describeNode('what a hostile sandbox can do with /run/sandnode, its console and podd', () => {
  let node: TestNode;
  let id: string;
  let pid: number;
  /** the sandbox's /run/sandnode as host readers see it (the server's sandbox dir), and the mount itself */
  const guestDir = () => path.join(node.dirs.runDir, 'sandboxes', id, 'guest');
  const guestMount = () => path.join(node.dirs.runDir, 'vm-tmpfs', id, 'guest');
  /** the host file of the init's stdout (in 0.2.0: <vmDir>/console.log on the host disk) */
  const consoleLog = () => {
    const capped = path.join(node.dirs.runDir, 'vm-tmpfs', id, 'console', 'console.log');
    return existsSync(capped) ? capped : path.join(node.dirs.runDir, 'vms', id, 'console.log');
  };
  const consoleSize = () => statSync(consoleLog()).size;
  const expectAlive = async () => {
    const s = (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
    expect(s.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(s.pid).toBe(pid);
    expect(isAlive(pid)).toBe(true);
    expect((await run(node.api, id, 'echo ok')).stdout).toBe('ok\n');
  };

  /**
   * Without a user namespace: in one (the default, attack-userns.it) root inside cannot even
   * reopen its console through /proc/1/fd/1 (EACCES), so the cap is what stands between a
   * sandbox of a node with `usernsRange ""` and the host; that is what these attacks try.
   */
  const NO_USERNS = { SANDNODE_VMM_SUPERVISOR_USERNS_RANGE: '' };

  beforeAll(async () => {
    node = await startNode({ env: { 'vmm-supervisor': NO_USERNS } });
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    id = sb.sandboxId;
    pid = sb.pid;
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('names its isolation in GetSandbox: seccomp, cgroup namespace, pids limit, guest tmpfs, console cap', async () => {
    const s = (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
    expect(s.isolation).toEqual(['vmm.cgroup-ns.v1', 'vmm.console-cap.v1', 'vmm.guest-tmpfs.v1', 'vmm.pids-limit.v1', 'vmm.seccomp.v1']);
    const listed = (await node.api.sandboxes.listSandboxes({})).sandboxes.find((x) => x.sandboxId === id)!;
    expect(listed.isolation).toEqual(s.isolation);
    // and the CLI shows it: sandbox get, status (grouped)
    const get = node.cli(['sandbox', 'get', id]);
    expect(get.stdout).toMatch(/^isolation\s+cgroup-ns,console-cap,guest-tmpfs,pids-limit,seccomp$/m);
    const st = JSON.parse(node.cli(['status', '--json']).stdout) as { isolation: { isolation: string[]; sandboxes: string[] }[] };
    expect(st.isolation).toEqual([{ isolation: s.isolation, sandboxes: [id] }]);
  });

  it('a fork child gets a /run/sandnode of its own (a fresh tmpfs), gone with it', async () => {
    await run(node.api, id, 'echo parent > /run/sandnode/mine');
    const child = (await node.api.sandboxes.forkSandbox({ parentId: id, maxFreezeMs: 2000 })).sandbox!;
    const childMount = path.join(node.dirs.runDir, 'vm-tmpfs', child.sandboxId, 'guest');
    expect(statfsSync(childMount).type).toBe(TMPFS_MAGIC);
    expect((await run(node.api, child.sandboxId, 'ls /run/sandnode/mine 2>&1; true')).stdout).toMatch(/No such file/);
    expect(child.isolation).toEqual((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.isolation);
    await node.api.sandboxes.deleteSandbox({ sandboxId: child.sandboxId });
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(child.sandboxId);
    expect(existsSync(path.join(node.dirs.runDir, 'vm-tmpfs', child.sandboxId))).toBe(false);
    await run(node.api, id, 'rm /run/sandnode/mine');
  });

  it('fills /run/sandnode until ENOSPC: it stops at the tmpfs size, on the host a tmpfs (nosuid,nodev,noexec), never the disk; the node serves', async () => {
    const r = await run(node.api, id, 'dd if=/dev/zero of=/run/sandnode/fill bs=1M count=64 2>&1; echo rc=$?');
    expect(statSync(path.join(guestDir(), 'fill')).size).toBeLessThanOrEqual(GUEST_BYTES);
    expect(r.stdout).toMatch(/No space left/);
    expect(r.stdout).not.toMatch(/rc=0/);
    expect(statfsSync(path.join(guestDir(), 'fill')).type).toBe(TMPFS_MAGIC);
    expect(mountOptionsOf(guestMount())).toEqual(expect.arrayContaining(['nosuid', 'nodev', 'noexec']));
    await expectAlive();
    // another sandbox is made and runs meanwhile
    const other = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    expect((await run(node.api, other.sandboxId, 'echo ok')).stdout).toBe('ok\n');
    await node.api.sandboxes.deleteSandbox({ sandboxId: other.sandboxId });
    // nothing of the other one is left mounted
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(other.sandboxId);
    await run(node.api, id, 'rm -f /run/sandnode/fill');
  });

  it('floods its init stdout (/proc/1/fd/1) with 100 MiB: the host keeps at most the 1 MiB cap, and the latest output; the sandbox lives and exec works', async () => {
    await run(node.api, id, 'i=0; while [ $i -lt 100 ]; do head -c 1048576 /dev/zero >> /proc/1/fd/1 2>/dev/null; i=$((i+1)); done; true');
    expect(consoleSize()).toBeLessThanOrEqual(CONSOLE_CAP);
    await waitFor('the supervisor to cut the console log to its tail', () => consoleSize() <= (CONSOLE_CAP * 3) / 4);
    await run(node.api, id, 'echo flood-marker-1 >> /proc/1/fd/1');
    await waitFor('the latest line in the console log', () => readFileSync(consoleLog(), 'latin1').includes('flood-marker-1'));
    await expectAlive();
  });

  it('truncates and sparsely extends its console (O_TRUNC, ftruncate to 10 GiB): the host file stays within the cap; the sandbox lives', async () => {
    await run(node.api, id, ': > /proc/1/fd/1; truncate -s 10G /proc/1/fd/1; echo rc=$?');
    await waitFor('the console log back within its cap', () => consoleSize() <= CONSOLE_CAP);
    await run(node.api, id, 'echo trunc-marker >> /proc/1/fd/1');
    await waitFor('the next line in the console log', () => readFileSync(consoleLog(), 'latin1').includes('trunc-marker'));
    expect(consoleSize()).toBeLessThanOrEqual(CONSOLE_CAP);
    await expectAlive();
  });

  it('kill -9 of the supervisor during a flood: the init is neither killed nor blocked, the console stays bounded, and the restarted supervisor keeps cutting it', async () => {
    // a flood that outlives the exec: every write of 1 MiB, errors ignored
    await run(node.api, id, "setsid sh -c 'while :; do head -c 1048576 /dev/zero 2>/dev/null; done >> /proc/1/fd/1 2>/dev/null' </dev/null >/dev/null 2>&1 & echo $! > /tmp/flood.pid");
    const vmm = findRunning(node.dirs, 'vmm-supervisor')!;
    process.kill(vmm.pid, 'SIGKILL');
    await waitFor('the supervisor to be gone', () => !isAlive(vmm.pid));
    // nobody cuts it now: the tmpfs fills up and further writes fail with ENOSPC
    await waitFor('the console log to fill up', () => consoleSize() >= CONSOLE_CAP - 64 * 1024);
    expect(consoleSize()).toBeLessThanOrEqual(CONSOLE_CAP);
    // the init is not blocked on its stdout: it reaps, podd (its child) serves exec
    expect(isAlive(pid)).toBe(true);
    expect((await run(node.api, id, 'echo ok; echo still >> /proc/1/fd/1; echo rc=$?')).stdout).toMatch(/^ok\nrc=/);
    await withEnv(NO_USERNS, () => startComponent(node.dirs, 'vmm-supervisor'));
    await run(node.api, id, 'kill -9 -$(cat /tmp/flood.pid) 2>/dev/null; kill -9 $(cat /tmp/flood.pid) 2>/dev/null; true');
    await waitFor('the adopted console log cut again', () => consoleSize() <= (CONSOLE_CAP * 3) / 4);
    await run(node.api, id, 'echo after-restart >> /proc/1/fd/1');
    await waitFor('the next line in the console log', () => readFileSync(consoleLog(), 'latin1').includes('after-restart'));
    expect(consoleSize()).toBeLessThanOrEqual(CONSOLE_CAP);
    await expectAlive();
  });

  it('replaces its podd with one that lies (healthy, podd.quiesce, a freeze it never made): a fork is ABORTED and leaves no child; the node serves and deletes it', async () => {
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const liar = sb.sandboxId;
    // the init starts whatever is at podd's path, with podd's socket as fd 3
    const put = await execCollect(node.api, liar, ['sh', '-c', 'cat > /tmp/liar.js && cp /tmp/liar.js /opt/sandnode/podd.js && echo ok'], { stdin: Buffer.from(LYING_PODD) });
    expect(put.stdout + put.stderr).toBe('ok\n');
    // kill the running podd (the init's only node child) once this exec has answered
    const kill = await run(node.api, liar, "setsid sh -c 'sleep 0.3; kill -9 $(pidof node)' </dev/null >/dev/null 2>&1 & echo started");
    expect(kill.stdout + kill.stderr).toBe('started\n');
    const liarLog = path.join(node.dirs.runDir, 'sandboxes', liar, 'guest', 'liar.log');
    await waitFor('the lying podd to serve podd.sock', () => existsSync(liarLog) && readFileSync(liarLog, 'utf8').includes('up'), 30_000).catch((err: Error) => {
      throw new Error(`${err.message}; podd.log: ${readFileSync(path.join(node.dirs.runDir, 'sandboxes', liar, 'guest', 'podd.log'), 'utf8').slice(-3000)}`);
    });
    const before = (await node.api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId).sort();
    await expectCode(node.api.sandboxes.forkSandbox({ parentId: liar, maxFreezeMs: 1000 }), Status.ABORTED, /freeze (was replaced by another freeze, or never made|ended)/);
    expect(readFileSync(liarLog, 'utf8')).toMatch(/Quiesce/);
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId).sort()).toEqual(before);
    expect((await node.api.sandboxes.getSandbox({ sandboxId: liar })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await node.api.sandboxes.deleteSandbox({ sandboxId: liar });
    await expectCode(node.api.sandboxes.getSandbox({ sandboxId: liar }), Status.NOT_FOUND);
    await expectAlive();
  });
});

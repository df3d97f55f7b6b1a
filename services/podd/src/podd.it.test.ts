/**
 * podd integration: the real podd process (dist/main.js, and the esbuild bundle alone in a
 * temp dir) on the host, no container, called over its unix socket.
 * Needs `npx tsc -b services/podd/tsconfig.build.json && npm run bundle --workspace @sandnode/podd`
 * (skips naming what is missing, fails under CI=true).
 */
import { spawn } from 'node:child_process';
import { closeSync, copyFileSync, existsSync, linkSync, openSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { Status } from 'nice-grpc';
import { createSandnodeChannel, createServiceClient, type ServiceClient } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { FileType, PoddServiceDefinition, type ExecRequest, type ExecResponse } from '@sandnode/shared/proto/podd/v1/podd';
import type { Channel } from 'nice-grpc';
import { built, describeWith, expectCode, makeTempDir, startDaemon, useTempDir, waitFor, type RunningDaemon } from '@sandnode/testkit';

const PODD_DIR = path.resolve(__dirname, '..');
const MAIN = path.join(PODD_DIR, 'dist', 'main.js');
const BUNDLE = path.join(PODD_DIR, 'dist', 'podd.bundle.js');
/** podd's dist/main.js and its bundle, built (describeWith: skip naming them, or fail under CI=true). */
const PODD_PARTS = [built('@sandnode/podd'), built('@sandnode/podd', 'dist/podd.bundle.js')];
const PKG_VERSION = (JSON.parse(readFileSync(path.join(PODD_DIR, 'package.json'), 'utf8')) as { version: string }).version;

interface RunningPodd {
  daemon: RunningDaemon;
  sock: string;
  logPath: string;
  channel: Channel;
  client: ServiceClient<typeof PoddServiceDefinition>;
  stop(): Promise<void>;
}

/** startPodd runs `node entry --socket <dir>/podd.sock` (testkit's daemon fixture, log <dir>/podd.log). */
async function startPodd(entry: string, dir: string, env: Record<string, string> = {}): Promise<RunningPodd> {
  const sock = path.join(dir, 'podd.sock');
  const logPath = path.join(dir, 'podd.log');
  const daemon = await startDaemon({ main: entry, args: ['--socket', sock], socket: sock, logFile: logPath, env: { SANDNODE_PODD_LOG_LEVEL: 'debug', ...env } });
  const channel = createSandnodeChannel(daemon.address);
  const client = createServiceClient(PoddServiceDefinition, channel, { timeoutMs: 10_000 });
  await client.health({});
  return {
    daemon,
    sock,
    logPath,
    channel,
    client,
    async stop() {
      channel.close();
      await daemon.stop();
    },
  };
}

async function collect(client: RunningPodd['client'], req: Partial<ExecRequest>, signal?: AbortSignal): Promise<ExecResponse[]> {
  const out: ExecResponse[] = [];
  for await (const ev of client.exec(req, { signal })) out.push(ev);
  return out;
}

function text(evs: ExecResponse[], which: 'stdout' | 'stderr'): string {
  return Buffer.concat(evs.flatMap((e) => (e.event?.$case === which ? [e.event.value] : []))).toString();
}

function exitOf(evs: ExecResponse[]) {
  const last = evs.at(-1)?.event;
  if (last?.$case !== 'exit') throw new Error(`last event is ${last?.$case}, not exit`);
  expect(evs.filter((e) => e.event?.$case === 'exit')).toHaveLength(1);
  return last.value;
}

/** Live (non-zombie) pids whose process group is pgid. */
function groupMembers(pgid: number): number[] {
  const pids: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue;
    }
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(rest[2]) === pgid && rest[0] !== 'Z' && rest[0] !== 'X') pids.push(Number(name));
  }
  return pids;
}

/** waitGroupGone waits (up to ms) until no live process is left in process group pgid. */
async function waitGroupGone(pgid: number, ms = 3000): Promise<void> {
  await waitFor(`process group ${pgid} to be gone`, () => groupMembers(pgid).length === 0, ms, 50);
}

function vmRssKb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? 0);
}

describeWith('podd (dist/main.js on the host)', PODD_PARTS, () => {
  let dir: string;
  let ws: string;
  let podd: RunningPodd;

  beforeAll(async () => {
    dir = makeTempDir('podd-it');
    ws = path.join(dir, 'workspace');
    mkdirSync(ws);
    // No freeze port here (the host's is tested in vmm-supervisor's podd-quiesce.it.test.ts).
    podd = await startPodd(MAIN, dir, { SANDNODE_PODD_DEFAULT_CWD: ws, SANDNODE_PODD_FREEZE_SOCKET: path.join(dir, 'no-freeze-port.sock') });
  });
  afterAll(async () => {
    await podd?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('Health and GetVersion', async () => {
    const h = await podd.client.health({});
    expect(h.ok).toBe(true);
    expect(h.hostname).toBe(hostname());
    expect(h.uptimeMs).toBeGreaterThanOrEqual(0);
    const v = await createServiceClient(VersionServiceDefinition, podd.channel).getVersion({});
    expect(v.component).toBe('podd');
    expect(v.version).toBe(PKG_VERSION);
    expect(v.features).toEqual(expect.arrayContaining(['podd.exec.v1', 'podd.files.v1']));
    expect(v.pid).toBe(podd.daemon.pid);
  });

  test('without a freeze port: no podd.quiesce, and Quiesce/Thaw/GetFreezeStatus are UNAVAILABLE (nothing frozen)', async () => {
    const v = await createServiceClient(VersionServiceDefinition, podd.channel).getVersion({});
    expect(v.features).not.toContain('podd.quiesce');
    await expectCode(podd.client.quiesce({ maxFreezeMs: 100 }), Status.UNAVAILABLE);
    await expectCode(podd.client.getFreezeStatus({}), Status.UNAVAILABLE);
    await expectCode(podd.client.thaw({ freezeToken: '' }), Status.INVALID_ARGUMENT);
    await expectCode(podd.client.thaw({ freezeToken: 'x' }), Status.UNAVAILABLE);
  });

  test('Exec streams started, stdout and stderr in order, then one exit', async () => {
    const evs = await collect(podd.client, { argv: ['sh', '-c', 'echo out1; sleep 0.1; echo err1 >&2; sleep 0.1; echo out2'] });
    expect(evs[0]?.event?.$case).toBe('started');
    expect(evs[0]?.event?.$case === 'started' && evs[0].event.value.pid).toBeGreaterThan(0);
    const seq = evs.slice(1, -1).map((e) => `${e.event?.$case}:${e.event?.$case === 'stdout' || e.event?.$case === 'stderr' ? e.event.value.toString() : ''}`);
    expect(seq).toEqual(['stdout:out1\n', 'stderr:err1\n', 'stdout:out2\n']);
    expect(exitOf(evs)).toMatchObject({ exitCode: 0, signal: '' });
  });

  test('Exec delivers several MB complete, in chunks of at most 64 KiB', async () => {
    const n = 1_000_000;
    const evs = await collect(podd.client, { argv: ['seq', '1', String(n)] });
    let expected = '';
    for (let i = 1; i <= n; i++) expected += `${i}\n`;
    const out = text(evs, 'stdout');
    expect(out.length).toBe(expected.length); // ~6.9 MB
    expect(out === expected).toBe(true);
    expect(evs.every((e) => e.event?.$case !== 'stdout' || e.event.value.length <= 65536)).toBe(true);
    expect(exitOf(evs).exitCode).toBe(0);
  });

  test('Exec exit codes and signals', async () => {
    expect(exitOf(await collect(podd.client, { argv: ['sh', '-c', 'exit 7'] }))).toMatchObject({ exitCode: 7, signal: '' });
    expect(exitOf(await collect(podd.client, { argv: ['sh', '-c', 'kill -TERM $$'] }))).toMatchObject({ exitCode: 143, signal: 'SIGTERM' });
    expect(exitOf(await collect(podd.client, { argv: ['sh', '-c', 'kill -KILL $$'] }))).toMatchObject({ exitCode: 137, signal: 'SIGKILL' });
  });

  test('Exec stdin, env, cwd', async () => {
    expect(text(await collect(podd.client, { argv: ['cat'], stdin: Buffer.from('hello stdin') }), 'stdout')).toBe('hello stdin');
    const big = Buffer.alloc(2 * 1024 * 1024, 'a');
    expect(text(await collect(podd.client, { argv: ['wc', '-c'], stdin: big }), 'stdout').trim()).toBe(String(big.length));
    // no stdin: the command sees EOF at once
    expect(exitOf(await collect(podd.client, { argv: ['cat'] })).exitCode).toBe(0);
    const env = text(await collect(podd.client, { argv: ['sh', '-c', 'echo "$FOO|$HOME|${PATH:+path}"'], env: { FOO: 'bar baz' } }), 'stdout');
    expect(env).toBe(`bar baz|${process.env.HOME ?? '/root'}|path\n`);
    expect(text(await collect(podd.client, { argv: ['pwd'] }), 'stdout')).toBe(`${ws}\n`);
    expect(text(await collect(podd.client, { argv: ['pwd'], cwd: dir }), 'stdout')).toBe(`${dir}\n`);
  });

  test('Exec timeout_ms: DEADLINE_EXCEEDED and the whole process group is gone', async () => {
    let pid = 0;
    const t0 = Date.now();
    await expectCode(
      (async () => {
        for await (const ev of podd.client.exec({ argv: ['sh', '-c', 'sleep 30 & sleep 30 & wait'], timeoutMs: 300 })) {
          if (ev.event?.$case === 'started') pid = ev.event.value.pid;
        }
      })(),
      Status.DEADLINE_EXCEEDED,
    );
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(pid).toBeGreaterThan(0);
    await waitGroupGone(pid);
  });

  test('cancelling the call kills the process group', async () => {
    const ac = new AbortController();
    let pid = 0;
    const run = (async () => {
      for await (const ev of podd.client.exec({ argv: ['sh', '-c', 'sleep 30 & echo ready; sleep 30'] }, { signal: ac.signal })) {
        if (ev.event?.$case === 'started') pid = ev.event.value.pid;
        if (ev.event?.$case === 'stdout') ac.abort();
      }
    })();
    await expect(run).rejects.toMatchObject({ name: 'AbortError' });
    expect(pid).toBeGreaterThan(0);
    await waitGroupGone(pid);
  });

  test('a slow consumer does not make podd buffer the output (backpressure)', async () => {
    const total = 64 * 1024 * 1024;
    const rss0 = vmRssKb(podd.daemon.pid);
    const it = podd.client.exec({ argv: ['head', '-c', String(total), '/dev/zero'] })[Symbol.asyncIterator]();
    const first = await it.next();
    expect(first.value?.event?.$case).toBe('started');
    const pid = first.value?.event?.$case === 'started' ? first.value.event.value.pid : 0;
    // The time under test: a consumer that reads nothing for 1.5 s (podd must not buffer meanwhile).
    await new Promise((r) => setTimeout(r, 1500));
    // The writer is blocked on a full pipe, not finished; podd holds far less than 64 MiB.
    expect(groupMembers(pid)).toContain(pid);
    const grownMb = (vmRssKb(podd.daemon.pid) - rss0) / 1024;
    expect(grownMb).toBeLessThan(32);
    let got = 0;
    for (;;) {
      const r = await it.next();
      if (r.done) break;
      if (r.value.event?.$case === 'stdout') got += r.value.event.value.length;
    }
    expect(got).toBe(total);
  });

  test('Exec bad input gets the contract status codes', async () => {
    const cases: Array<[Partial<ExecRequest>, Status, RegExp]> = [
      [{ argv: [] }, Status.INVALID_ARGUMENT, /argv/],
      [{ argv: [''] }, Status.INVALID_ARGUMENT, /argv/],
      [{ argv: ['no-such-command-sandnode'] }, Status.NOT_FOUND, /no-such-command-sandnode/],
      [{ argv: ['/nonexistent/bin/x'] }, Status.NOT_FOUND, /argv/],
      [{ argv: ['true'], cwd: path.join(dir, 'missing') }, Status.INVALID_ARGUMENT, /cwd/],
      [{ argv: ['true'], cwd: 'relative' }, Status.INVALID_ARGUMENT, /cwd/],
      [{ argv: ['true'], stdin: Buffer.alloc(3 * 1024 * 1024 + 1) }, Status.INVALID_ARGUMENT, /stdin/],
      [{ argv: ['true'], env: { 'A=B': '1' } }, Status.INVALID_ARGUMENT, /env/],
    ];
    for (const [req, code, re] of cases) {
      await expectCode(collect(podd.client, req), code, re).catch((err: Error) => {
        throw new Error(`argv ${JSON.stringify(req.argv)}: ${err.message}`);
      });
    }
  });

  test('files: round trip, append, offset/length, create_parents, mode, stat', async () => {
    const f = path.join(dir, 'files', 'a', 'b.txt');
    expect((await podd.client.writeFile({ path: f, data: Buffer.from('hello'), createParents: true, mode: 0o600 })).sizeBytes).toBe(5);
    expect(readFileSync(f, 'utf8')).toBe('hello'); // on disk as soon as the call returned
    expect((await podd.client.writeFile({ path: f, data: Buffer.from(' world'), append: true })).sizeBytes).toBe(11);
    const r = await podd.client.readFile({ path: f });
    expect(r.data.toString()).toBe('hello world');
    expect(r).toMatchObject({ sizeBytes: 11, eof: true });
    expect(await podd.client.readFile({ path: f, offset: 6, length: 3 })).toMatchObject({ data: Buffer.from('wor'), sizeBytes: 11, eof: false });
    const st = await podd.client.stat({ path: f });
    expect(st).toMatchObject({ type: FileType.FILE_TYPE_REGULAR, sizeBytes: 11, mode: 0o600 });
    expect(Math.abs(st.mtimeMs - statSync(f).mtimeMs)).toBeLessThan(2);
    expect((await podd.client.stat({ path: path.dirname(f) })).type).toBe(FileType.FILE_TYPE_DIRECTORY);
    symlinkSync('b.txt', path.join(path.dirname(f), 'link'));
    expect((await podd.client.stat({ path: path.join(path.dirname(f), 'link') })).type).toBe(FileType.FILE_TYPE_SYMLINK);
    // replace
    expect((await podd.client.writeFile({ path: f, data: Buffer.from('x') })).sizeBytes).toBe(1);
    // 3 MiB binary round trip
    const big = Buffer.alloc(3 * 1024 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7) & 0xff;
    await podd.client.writeFile({ path: path.join(dir, 'files', 'big.bin'), data: big });
    const rb = await podd.client.readFile({ path: path.join(dir, 'files', 'big.bin') });
    expect(rb.data.equals(big)).toBe(true);
    expect(rb.eof).toBe(true);
  });

  test('files: bad input gets the contract status codes', async () => {
    writeFileSync(path.join(dir, 'plain'), 'x');
    const cases: Array<[string, () => Promise<unknown>, Status, RegExp]> = [
      ['read relative', () => podd.client.readFile({ path: 'rel' }), Status.INVALID_ARGUMENT, /path/],
      ['read too long', () => podd.client.readFile({ path: path.join(dir, 'plain'), length: 3 * 1024 * 1024 + 1 }), Status.INVALID_ARGUMENT, /length/],
      ['read missing', () => podd.client.readFile({ path: path.join(dir, 'missing') }), Status.NOT_FOUND, /missing/],
      ['read dir', () => podd.client.readFile({ path: dir }), Status.FAILED_PRECONDITION, /directory/],
      ['write relative', () => podd.client.writeFile({ path: 'rel', data: Buffer.from('x') }), Status.INVALID_ARGUMENT, /path/],
      ['write too big', () => podd.client.writeFile({ path: path.join(dir, 'big'), data: Buffer.alloc(3 * 1024 * 1024 + 1) }), Status.INVALID_ARGUMENT, /data/],
      ['write no parent', () => podd.client.writeFile({ path: path.join(dir, 'no', 'parent'), data: Buffer.from('x') }), Status.NOT_FOUND, /parent/],
      ['write dir', () => podd.client.writeFile({ path: ws, data: Buffer.from('x') }), Status.FAILED_PRECONDITION, /directory/],
      ['stat relative', () => podd.client.stat({ path: 'rel' }), Status.INVALID_ARGUMENT, /path/],
      ['stat missing', () => podd.client.stat({ path: path.join(dir, 'missing') }), Status.NOT_FOUND, /missing/],
    ];
    for (const [name, call, code, re] of cases) {
      await expectCode(call(), code, re).catch((err: Error) => {
        throw new Error(`${name}: ${err.message}`);
      });
    }
  });
});

describeWith('podd bundle (dist/podd.bundle.js alone, no node_modules)', PODD_PARTS, () => {
  const tmp = useTempDir('podd-bundle');
  test('serves Health, GetVersion with build constants, Exec; SIGTERM stops it and TERMs running commands', async () => {
    const dir = tmp();
    let podd: RunningPodd | undefined;
    try {
      const lone = path.join(dir, 'podd.js');
      copyFileSync(BUNDLE, lone);
      podd = await startPodd(lone, dir, { SANDNODE_PODD_DEFAULT_CWD: dir, NODE_PATH: '' });
      expect((await podd.client.health({})).ok).toBe(true);
      const v = await createServiceClient(VersionServiceDefinition, podd.channel).getVersion({});
      expect(v).toMatchObject({ component: 'podd', version: PKG_VERSION });
      expect(v.commit).toMatch(/^([0-9a-f]{40}|unknown)$/);
      expect(v.features).toEqual(expect.arrayContaining(['podd.exec.v1', 'podd.files.v1']));
      expect(text(await collect(podd.client, { argv: ['echo', 'bundled'] }), 'stdout')).toBe('bundled\n');

      // SIGTERM while a command runs: the command gets SIGTERM, its stream ends with exit 143,
      // podd exits 0 and removes its socket.
      const evs: ExecResponse[] = [];
      const running = (async () => {
        for await (const ev of podd!.client.exec({ argv: ['sleep', '30'] })) evs.push(ev);
      })();
      await waitFor('the first Exec event', () => evs.length > 0);
      const stopped = podd.daemon.kill('SIGTERM');
      await running;
      expect(exitOf(evs)).toMatchObject({ exitCode: 143, signal: 'SIGTERM' });
      expect(await stopped).toEqual({ code: 0, signal: null });
      expect(existsSync(podd.sock)).toBe(false);
      const log = readFileSync(podd.logPath, 'utf8');
      expect(log).toMatch(/"msg":"podd listening"/);
      expect(log).toMatch(/"msg":"stopped"/);
    } finally {
      await podd?.stop();
    }
  });
});

describeWith('podd on an inherited listening socket (--listen-fd)', PODD_PARTS, () => {
  const tmp = useTempDir('podd-fd');
  it('serves on fd 3 held by a respawning parent (like the sandbox init); a killed podd is replaced on the same socket', async () => {
    const dir = tmp();
    const sock = path.join(dir, 'podd.sock');
    const tmpSock = `${sock}.tmp`;
    // Bind like the vmm-supervisor does: at a temp name, hard-linked to the real name, so that
    // closing our copy only unlinks the temp name.
    const listener = net.createServer();
    await new Promise<void>((r) => listener.listen(tmpSock, () => r()));
    linkSync(tmpSock, sock);
    const fd = (listener as unknown as { _handle: { fd: number } })._handle.fd;
    const logFd = openSync(path.join(dir, 'podd.log'), 'a');
    // the "init": holds fd 3 and restarts podd when it dies
    const init = spawn('sh', ['-c', `while :; do "${process.execPath}" "${MAIN}"; sleep 0.1; done`], {
      stdio: ['ignore', logFd, logFd, fd],
      env: { ...process.env, SANDNODE_PODD_LISTEN_FD: '3', SANDNODE_PODD_DEFAULT_CWD: dir },
      detached: true,
    });
    await new Promise<void>((r) => listener.close(() => r())); // our copy: no longer accepting
    const channel = createSandnodeChannel(`unix://${sock}`);
    const client = createServiceClient(PoddServiceDefinition, channel, { timeoutMs: 2000 });
    const healthy = (what: string) => waitFor(what, () => client.health({}, { retry: false }).then((h) => h.ok), 10_000, 50);
    const poddPid = () => Number(readFileSync(`/proc/${init.pid}/task/${init.pid}/children`, 'utf8').trim().split(' ')[0]);
    try {
      expect(existsSync(tmpSock)).toBe(false);
      await healthy('podd on fd 3 to answer Health');
      const first = poddPid();
      process.kill(first, 'SIGKILL');
      await healthy('the respawned podd to answer Health');
      expect(poddPid()).not.toBe(first);
      const evs = await collect(client, { argv: ['echo', 'via fd'] });
      expect(text(evs, 'stdout')).toBe('via fd\n');
    } finally {
      try {
        process.kill(-(init.pid as number), 'SIGKILL');
      } catch {
        /* gone */
      }
      channel.close();
      closeSync(logFd);
    }
  });
});

describeWith('podd command line', PODD_PARTS, () => {
  const runMain = (args: string[], env: Record<string, string> = {}) =>
    new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const p = spawn(process.execPath, [MAIN, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      p.once('exit', (code) => resolve({ code, stderr }));
    });

  test('--config without a value, an unknown argument and a bad failpoint exit 2 naming them', async () => {
    const noValue = await runMain(['--config']);
    expect(noValue).toMatchObject({ code: 2, stderr: expect.stringContaining('--config needs a value') });
    const unknown = await runMain(['--bogus']);
    expect(unknown).toMatchObject({ code: 2, stderr: expect.stringContaining('unknown argument "--bogus"') });
    const badFailpoint = await runMain(['--socket', '/tmp/podd-never.sock'], { SANDNODE_PODD_FAILPOINTS: 'no.such' });
    expect(badFailpoint).toMatchObject({ code: 2, stderr: expect.stringContaining('SANDNODE_PODD_FAILPOINTS: unknown failpoint "no.such"') });
  });
});

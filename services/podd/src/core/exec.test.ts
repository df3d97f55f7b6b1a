import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { DeadlineExceededError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import { ExecRunner, exitCodeOf, type ExecEvent, type ExecSpec } from './exec';
import { MAX_EXEC_ARGS_BYTES, MAX_EXEC_STRING_BYTES } from './limits';

async function collect(runner: ExecRunner, spec: ExecSpec, signal?: AbortSignal): Promise<ExecEvent[]> {
  const out: ExecEvent[] = [];
  for await (const ev of runner.run(spec, signal)) out.push(ev);
  return out;
}

describe('podd core exec', () => {
  let dir: string;
  let runner: ExecRunner;
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-exec-'));
    runner = new ExecRunner({ defaultCwd: dir, maxChunkBytes: 1000, highWaterBytes: 64 * 1024 });
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('started first, chunks capped at maxChunkBytes, exit last', async () => {
    const evs = await collect(runner, { argv: ['head', '-c', '100000', '/dev/zero'] });
    expect(evs[0]?.kind).toBe('started');
    expect(evs.at(-1)).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
    const chunks = evs.filter((e): e is { kind: 'stdout'; data: Buffer } => e.kind === 'stdout');
    expect(chunks.every((c) => c.data.length <= 1000)).toBe(true);
    expect(chunks.reduce((n, c) => n + c.data.length, 0)).toBe(100000);
    expect(runner.running).toBe(0);
  });

  test('default cwd, env merge', async () => {
    const evs = await collect(runner, { argv: ['sh', '-c', 'pwd; echo $X; test -n "$PATH" && echo path'], env: { X: 'y' } });
    const text = Buffer.concat(evs.flatMap((e) => (e.kind === 'stdout' ? [e.data] : []))).toString();
    expect(text).toBe(`${dir}\ny\npath\n`);
  });

  test('validation and spawn errors', async () => {
    await expect(collect(runner, { argv: [] })).rejects.toThrow(InvalidArgumentError);
    await expect(collect(runner, { argv: [''] })).rejects.toThrow(/^argv/);
    await expect(collect(runner, { argv: ['true'], cwd: path.join(dir, 'nope') })).rejects.toThrow(/^cwd/);
    await expect(collect(runner, { argv: ['true'], env: { 'A=B': 'x' } })).rejects.toThrow(/^env/);
    await expect(collect(runner, { argv: ['definitely-not-a-command-xyz'] })).rejects.toThrow(NotFoundError);
  });

  test('argv and env size limits answer InvalidArgumentError naming the field and the limit', async () => {
    const big = 'x'.repeat(200 * 1024);
    await expect(collect(runner, { argv: ['echo', big] })).rejects.toThrow(new InvalidArgumentError(`argv: argv[1] is ${200 * 1024} bytes, at most ${MAX_EXEC_STRING_BYTES} per argument`));
    await expect(collect(runner, { argv: ['true'], env: { BIG: big } })).rejects.toThrow(/^env: BIG is \d+ bytes as KEY=VALUE, at most 131071/);
    const many = Array.from({ length: 10 }, () => 'y'.repeat(120 * 1024));
    await expect(collect(runner, { argv: ['true', ...many] })).rejects.toThrow(new RegExp(`^argv \\+ env: \\d+ bytes, at most ${MAX_EXEC_ARGS_BYTES} together`));
    // the largest single argument still runs
    const evs = await collect(runner, { argv: ['sh', '-c', 'echo ${#1}', 'sh', 'z'.repeat(MAX_EXEC_STRING_BYTES)] });
    expect(Buffer.concat(evs.flatMap((e) => (e.kind === 'stdout' ? [e.data] : []))).toString()).toBe(`${MAX_EXEC_STRING_BYTES}\n`);
  });

  test("a spawn that fails with E2BIG (podd's own environment too large) is InvalidArgumentError", async () => {
    const baseEnv: Record<string, string> = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
    for (let i = 0; i < 64; i++) baseEnv[`PAD${i}`] = 'p'.repeat(120 * 1024);
    const r = new ExecRunner({ defaultCwd: dir, maxChunkBytes: 1000, baseEnv });
    const err = await collect(r, { argv: ['true'] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidArgumentError);
    expect((err as Error).message).toMatch(/^argv \+ env: too long for the kernel \(E2BIG\)/);
    expect(r.running).toBe(0);
  });

  test('timeout kills the group and throws DeadlineExceededError', async () => {
    const t0 = Date.now();
    await expect(collect(runner, { argv: ['sleep', '30'], timeoutMs: 200 })).rejects.toThrow(DeadlineExceededError);
    expect(Date.now() - t0).toBeLessThan(5000);
  });

  test('a slow consumer pauses the pipes (bounded buffering)', async () => {
    const highWater = 64 * 1024;
    const events: Array<{ paused: boolean; queued: number }> = [];
    let firstPause: () => void = () => undefined;
    const paused = new Promise<void>((resolve) => (firstPause = resolve));
    const r = new ExecRunner({
      defaultCwd: dir,
      maxChunkBytes: 1000,
      highWaterBytes: highWater,
      onBackpressure: (p, queued) => {
        events.push({ paused: p, queued });
        if (p) firstPause();
      },
    });
    const size = 32 * 1024 * 1024;
    const it = r.run({ argv: ['head', '-c', String(size), '/dev/zero'] });
    const first = await it.next();
    expect(first.value).toMatchObject({ kind: 'started' });
    // Nothing is consumed: the runner must pause the pipes once highWater bytes wait, and it
    // must do so long before head has written everything (the pipes then hold it back).
    await paused;
    expect(events[0]?.paused).toBe(true);
    // One pipe read (at most 64 KiB) may land on top of the high-water mark, no more.
    expect(events[0]!.queued).toBeGreaterThanOrEqual(highWater);
    expect(events[0]!.queued).toBeLessThanOrEqual(highWater + 64 * 1024);
    let total = 0;
    let last: ExecEvent | undefined;
    for (;;) {
      const next = await it.next();
      if (next.done) break;
      last = next.value;
      if (next.value.kind === 'stdout') total += next.value.data.length;
    }
    expect(total).toBe(size);
    expect(last).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
    // Every pause was at most one read above the mark, and each was followed by a resume.
    expect(events.every((e) => !e.paused || e.queued <= highWater + 64 * 1024)).toBe(true);
    expect(events.filter((e) => e.paused).length).toBeGreaterThan(1);
    expect(events.filter((e) => !e.paused).every((e) => e.queued <= highWater / 2)).toBe(true);
  });

  test('a background process that keeps the pipes open does not hold the exit back', async () => {
    const r = new ExecRunner({ defaultCwd: dir, maxChunkBytes: 65536, exitDrainMs: 300 });
    const t0 = Date.now();
    const evs = await collect(r, { argv: ['sh', '-c', 'sleep 5 & echo done'] });
    expect(Date.now() - t0).toBeLessThan(3000);
    expect(evs.at(-1)).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
    const started = evs[0];
    if (started?.kind === 'started') process.kill(-started.pid, 'SIGKILL'); // the leftover sleep
  });

  test('exitCodeOf maps signals to 128 + signo', () => {
    expect(exitCodeOf(null, 'SIGKILL')).toEqual({ exitCode: 137, signal: 'SIGKILL' });
    expect(exitCodeOf(3, null)).toEqual({ exitCode: 3, signal: '' });
  });
});

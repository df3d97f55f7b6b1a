import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { DeadlineExceededError, InvalidArgumentError, NotFoundError, processState } from '@sandnode/shared';
import { ExecRunner, exitCodeOf, type ExecEvent, type ExecSpec } from './exec';

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

  test('timeout kills the group and throws DeadlineExceededError', async () => {
    const t0 = Date.now();
    await expect(collect(runner, { argv: ['sleep', '30'], timeoutMs: 200 })).rejects.toThrow(DeadlineExceededError);
    expect(Date.now() - t0).toBeLessThan(5000);
  });

  test('a slow consumer pauses the pipes (bounded buffering)', async () => {
    const it = runner.run({ argv: ['head', '-c', String(32 * 1024 * 1024), '/dev/zero'] });
    const first = await it.next();
    expect(first.value).toMatchObject({ kind: 'started' });
    const pid = first.value?.kind === 'started' ? first.value.pid : 0;
    await new Promise((r) => setTimeout(r, 500));
    // Unthrottled, head writes 32 MiB in far less than 500 ms and exits; paused pipes block it.
    expect(processState(pid)).toBe('S');
    let total = 0;
    let last: ExecEvent | undefined;
    for (;;) {
      const r = await it.next();
      if (r.done) break;
      last = r.value;
      if (r.value.kind === 'stdout') total += r.value.data.length;
    }
    expect(total).toBe(32 * 1024 * 1024);
    expect(last).toEqual({ kind: 'exit', exitCode: 0, signal: '' });
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

/**
 * Adversarial finding (issue 11, exec limits): bad input gets a clear code. Seen on a real node
 * through the server's Exec:
 * - argv[0] of 256 bytes (a file name longer than NAME_MAX) or a 5000-byte path (longer than
 *   PATH_MAX): spawn fails ENAMETOOLONG, podd answers UNKNOWN "internal error";
 * - cwd of 100 KiB: podd's INVALID_ARGUMENT echoes the whole path in grpc-message, the header
 *   is too large for HTTP/2, and the caller gets INTERNAL "Received RST_STREAM with code 2".
 * Both must be INVALID_ARGUMENT with a message short enough for a header.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { InvalidArgumentError } from '@sandnode/shared';
import { ExecRunner, spawnError, type ExecEvent, type ExecSpec } from '../core/exec';

async function collect(runner: ExecRunner, spec: ExecSpec): Promise<ExecEvent[]> {
  const out: ExecEvent[] = [];
  for await (const ev of runner.run(spec)) out.push(ev);
  return out;
}

/** The most bytes an error message may have to travel in a grpc-message header (well under HTTP/2's 16 KiB header list). */
const MAX_MESSAGE_BYTES = 4096;

describe('podd exec: names too long for the kernel', () => {
  let dir: string;
  let runner: ExecRunner;
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'podd-attack-exec-'));
    runner = new ExecRunner({ defaultCwd: dir, maxChunkBytes: 1000, highWaterBytes: 64 * 1024 });
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it.each([
    ['a 256-byte command name', ['x'.repeat(256)]],
    ['a 5000-byte command path', ['/a'.repeat(2500)]],
  ])('%s is INVALID_ARGUMENT', async (_what, argv) => {
    await expect(collect(runner, { argv })).rejects.toThrow(InvalidArgumentError);
  });

  it('a 100 KiB cwd is INVALID_ARGUMENT with a message that fits a header', async () => {
    const err = await collect(runner, { argv: ['true'], cwd: `/${'d'.repeat(100 * 1024)}` }).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(err).toBeInstanceOf(InvalidArgumentError);
    expect(Buffer.byteLength(err!.message)).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
  });
});

describe('podd exec: spawn errors of a name too long for the kernel', () => {
  it('ENAMETOOLONG (a PATH directory + argv[0] longer than PATH_MAX) is INVALID_ARGUMENT naming argv[0]', () => {
    const err = spawnError(Object.assign(new Error('spawn ENAMETOOLONG'), { code: 'ENAMETOOLONG' }), 'tool');
    expect(err).toBeInstanceOf(InvalidArgumentError);
    expect((err as Error).message).toMatch(/^argv\[0\]: "tool": .*ENAMETOOLONG/);
  });
});

import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { ServerApi } from '@sandnode/node-stack';
import { FileType, type FileInfo } from '@sandnode/shared/proto/server/v1/files';
import { ageText, processColumns, processRows } from './sandbox-exec';
import { download, infoLine, listAll, LS_MAX_ENTRIES } from './sandbox-files';

/** fakeApi answers DownloadFile with data (a first message with the size, then the data), as the server does. */
function fakeApi(data: Buffer): ServerApi {
  return {
    sandboxes: {
      async *downloadFile() {
        yield { data: Buffer.alloc(0), offset: 0, sizeBytes: data.length };
        yield { data, offset: 0, sizeBytes: 0 };
      },
    },
  } as unknown as ServerApi;
}

// `sandbox cp sb-..:PATH DIR/` writes a temp file `.<name>.sandnode-download-<12 hex>` beside the
// target. A name the file system takes (up to 255 bytes) must not make a temp name above 255
// bytes, or the copy of a file with a long name fails with ENAMETOOLONG.
describe('sandbox cp download temp names stay within NAME_MAX', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'cli-names-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test.each([
    ['ASCII, 240 bytes', 'a'.repeat(240)],
    ['ASCII, 255 bytes', 'b'.repeat(255)],
    ['3-byte characters, 255 bytes', '字'.repeat(85)],
    ['4-byte characters, 252 bytes', '😀'.repeat(63)],
    ['short', 'f.txt'],
  ])('a file named with %s downloads into a directory', async (_what, name) => {
    const data = Buffer.from('hello');
    const r = await download(fakeApi(data), { sandboxId: 'sb-0123456789abcdef', path: `/workspace/${name}` }, `${dir}/`, { json: true });
    expect(r.destination).toBe(path.join(dir, name));
    expect(readFileSync(path.join(dir, name)).equals(data)).toBe(true);
    expect(readdirSync(dir)).toEqual([name]); // no temp file left behind
  });
});

// The sandbox runs podd: a hostile one can announce a size and then send without end, to fill the
// disk of the host that runs `sandbox cp`. The copy stops at the announced size (without --resume it keeps nothing).
describe('sandbox cp download from a sandbox that sends more than it announced', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'cli-over-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test('fails at the first byte past the size and leaves no file', async () => {
    let sent = 0;
    const api = {
      sandboxes: {
        async *downloadFile() {
          yield { data: Buffer.alloc(0), offset: 0, sizeBytes: 10 };
          for (let pos = 0; pos < 64 * 1024 * 1024; pos += 1024 * 1024) {
            sent += 1024 * 1024;
            yield { data: Buffer.alloc(1024 * 1024, 7), offset: pos, sizeBytes: 0 };
          }
        },
      },
    } as unknown as ServerApi;
    await expect(download(api, { sandboxId: 'sb-0123456789abcdef', path: '/workspace/f' }, `${dir}/`, { json: true })).rejects.toThrow(/more than the 10 bytes/);
    expect(sent).toBe(1024 * 1024); // stopped at the first message past the size
    expect(readdirSync(dir)).toEqual([]);
  });
});

// File names come from the sandbox. `sandbox ls` prints them to the operator's terminal: one named
// with escape sequences (OSC to retitle, CSI to move the cursor and erase lines, a C1 CSI) must
// not reach the terminal as such.
describe('sandbox ls shows control characters of names escaped', () => {
  const entry = (name: string): FileInfo => ({ name, type: FileType.FILE_TYPE_REGULAR, sizeBytes: 1, mode: 0o644, mtimeMs: 0, linkTarget: '' });
  test.each([
    ['an OSC title', '\u001b]0;owned\u0007x', '\\x1b]0;owned\\x07x'],
    ['cursor up and erase line', 'a\u001b[1A\u001b[2Kb', 'a\\x1b[1A\\x1b[2Kb'],
    ['a newline and a carriage return', 'fake\nfile  0644\rz', 'fake\\x0afile  0644\\x0dz'],
    ['a C1 CSI and DEL', 'c\u009b2Jd\u007f', 'c\\x9b2Jd\\x7f'],
    ['a plain non-ASCII name', 'dé字😀.txt', 'dé字😀.txt'],
  ])('%s', (_what, name, shown) => {
    const line = infoLine(entry(name));
    expect(line.endsWith(` ${shown}`)).toBe(true);
    expect(line).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/); // eslint-disable-line no-control-regex
  });
});

// `sandbox ps` prints what the sandbox's podd says of its commands: the same escaping applies.
describe('sandbox ps shows control characters escaped', () => {
  test('exec id, signal and command line', () => {
    const p = {
      execId: 'x\u001b[2J',
      pid: 7,
      argv: ['sh', '-c', 'echo \u001b]0;owned\u0007'],
      startedAtMs: 0,
      endedAtMs: 5,
      running: false,
      exitCode: 0,
      signal: 'SIG\u009bK',
      pty: false,
      attached: false,
    };
    const row = processRows([p])[0]!;
    expect(row).toEqual(['x\\x1b[2J', 7, 'killed (SIG\\x9bK)', new Date(0).toISOString(), '', 'sh -c echo \\x1b]0;owned\\x07']);
  });
});

// The pages of `sandbox ls` come from the sandbox's podd: one that answers with a page token it
// gave before, or with pages without end, must not keep the CLI collecting (memory) forever.
describe('sandbox ls of a podd that pages without end', () => {
  const entry: FileInfo = { name: 'f', type: FileType.FILE_TYPE_REGULAR, sizeBytes: 1, mode: 0o644, mtimeMs: 0, linkTarget: '' };
  const page = Array.from({ length: 1000 }, () => entry);
  function pagingApi(tokenOf: (call: number) => string): { api: ServerApi; calls: () => number } {
    let calls = 0;
    const api = {
      sandboxes: {
        listDirectory: async () => {
          if (++calls > 5000) throw new Error('the test bound: the listing did not stop');
          return { entries: page, nextPageToken: tokenOf(calls) };
        },
      },
    } as unknown as ServerApi;
    return { api, calls: () => calls };
  }

  test('a page token seen before stops the listing with a CliError', async () => {
    const { api, calls } = pagingApi((n) => `t${n % 3}`);
    await expect(listAll(api, 'sb-0123456789abcdef', '')).rejects.toThrow(/came back to a page it gave before/);
    expect(calls()).toBe(4); // t1, t2, t0, then t1 again
  });

  test('more than LS_MAX_ENTRIES entries stop the listing with a CliError', async () => {
    const { api, calls } = pagingApi((n) => `t${n}`);
    await expect(listAll(api, 'sb-0123456789abcdef', 'd')).rejects.toThrow(`more than ${LS_MAX_ENTRIES} entries`);
    expect(calls()).toBe(LS_MAX_ENTRIES / 1000 + 1);
  });

  test('a listing that ends is returned whole', async () => {
    const { api } = pagingApi((n) => (n < 3 ? `t${n}` : ''));
    expect(await listAll(api, 'sb-0123456789abcdef', '')).toHaveLength(3000);
  });
});

// `sandbox ps -o wide` adds what the plain table leaves out: whether a client is attached, the age, and when a finished command ended.
describe('sandbox ps -o wide', () => {
  const p = { execId: 'ex-1', pid: 9, argv: ['sleep', '100'], startedAtMs: 1_000, endedAtMs: 0, running: true, exitCode: 0, signal: '', pty: true, attached: true };
  test('adds ATTACHED, AGE and ENDED before the command', () => {
    expect(processColumns(true)).toEqual(['EXEC ID', 'PID', 'STATUS', 'STARTED', 'TTY', 'ATTACHED', 'AGE', 'ENDED', 'COMMAND']);
    expect(processRows([p], true, 1_000 + 3_725_000)[0]).toEqual(['ex-1', 9, 'running', new Date(1_000).toISOString(), 'tty', 'yes', '1h2m', '-', 'sleep 100']);
    expect(processRows([{ ...p, attached: false }], true, 1_000)[0]![5]).toBe('no');
    expect(processRows([p])[0]).toHaveLength(processColumns(false).length);
  });
  test('ENDED: the exit time and how long it ran; a podd that does not say is named, not shown as 1970', () => {
    const done = { ...p, running: false, endedAtMs: 1_000 + 125_000 };
    expect(processRows([done], true, 9e9)[0]![7]).toBe(`${new Date(126_000).toISOString()} (ran 2m)`);
    expect(processRows([{ ...done, endedAtMs: 0 }], true)[0]![7]).toBe('not told (older podd)');
    expect(processRows([done], true)[0]).toHaveLength(processColumns(true).length);
  });
  test.each([
    [-5, '0s'],
    [59_999, '59s'],
    [60_000, '1m'],
    [3_600_000, '1h'],
    [90_000_000, '1d1h'],
    [172_800_000, '2d'],
  ])('age of %d ms is %s', (ms, text) => expect(ageText(ms)).toBe(text));
});

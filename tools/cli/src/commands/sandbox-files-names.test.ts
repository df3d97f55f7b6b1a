import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { ServerApi } from '@sandnode/node-stack';
import { download } from './sandbox-files';

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

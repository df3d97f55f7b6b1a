import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { ServerApi } from '@sandnode/node-stack';
import { processStartTicks } from '@sandnode/shared';
import { FileType, type FileInfo } from '@sandnode/shared/proto/server/v1/files';
import { sweepDeadTemps } from './local-beneath';
import { download } from './sandbox-files';
import { downloadTree } from './sandbox-tree';

const ID = 'sb-0123456789abcdef';
const info = (name: string, type: FileType, extra: Partial<FileInfo> = {}): FileInfo => ({ name, type, sizeBytes: 0, mode: 0o755, mtimeMs: 0, linkTarget: '', ...extra });

/** fakeApi is a hostile sandbox: a tree of entries (by path) and file contents (by path). */
function fakeApi(tree: Record<string, FileInfo[]>, files: Record<string, Buffer>): ServerApi {
  return {
    sandboxes: {
      async statFile(req: { path: string }) {
        return { info: info(path.posix.basename(req.path), tree[req.path] ? FileType.FILE_TYPE_DIRECTORY : FileType.FILE_TYPE_REGULAR) };
      },
      async listDirectory(req: { path: string }) {
        return { entries: tree[req.path] ?? [], nextPageToken: '' };
      },
      async *downloadFile(req: { path: string; offset: number }) {
        const d = files[req.path] ?? Buffer.alloc(0);
        yield { data: Buffer.alloc(0), offset: req.offset, sizeBytes: d.length };
        if (d.length > req.offset) yield { data: d.subarray(req.offset), offset: req.offset, sizeBytes: 0 };
      },
    },
  } as unknown as ServerApi;
}

// Copying out of a sandbox must never write outside the directory the user named: a symlink the
// sandbox had copied out before (or one the sandbox lists first) must not redirect a later write.
describe('sandbox cp out writes only below the target, never through a symlink', () => {
  let dir: string;
  let outside: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'cli-beneath-'));
    outside = path.join(dir, 'outside');
    mkdirSync(outside);
    writeFileSync(path.join(outside, 'bashrc'), 'mine\n');
    mkdirSync(path.join(dir, 'out'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test('--resume into a target that is a symlink is refused, the file it names untouched', async () => {
    symlinkSync(path.join(outside, 'bashrc'), path.join(dir, 'out', 'f'));
    const api = fakeApi({}, { '/workspace/f': Buffer.from('mine\nevil\n') });
    await expect(download(api, { sandboxId: ID, path: '/workspace/f' }, path.join(dir, 'out', 'f'), { resume: true, json: true })).rejects.toThrow(/symlink/);
    expect(readFileSync(path.join(outside, 'bashrc'), 'utf8')).toBe('mine\n');
  });

  test('a plain copy replaces a symlink at the target (rename), never writes through it', async () => {
    symlinkSync(path.join(outside, 'bashrc'), path.join(dir, 'out', 'f'));
    const api = fakeApi({}, { '/workspace/f': Buffer.from('new') });
    await download(api, { sandboxId: ID, path: '/workspace/f' }, path.join(dir, 'out', 'f'), { json: true });
    expect(readFileSync(path.join(outside, 'bashrc'), 'utf8')).toBe('mine\n');
    expect(lstatSync(path.join(dir, 'out', 'f')).isFile()).toBe(true);
  });

  test('a directory copy keeps symlinks as symlinks and modes; a second copy with the link now a directory is refused', async () => {
    const first = fakeApi(
      {
        '/workspace/d': [
          info('evil', FileType.FILE_TYPE_SYMLINK, { linkTarget: outside }),
          info('f', FileType.FILE_TYPE_REGULAR, { mode: 0o640, sizeBytes: 2 }),
          info('sub', FileType.FILE_TYPE_DIRECTORY, { mode: 0o700 }),
        ],
        '/workspace/d/sub': [],
      },
      { '/workspace/d/f': Buffer.from('hi') },
    );
    const r = await downloadTree(first, { sandboxId: ID, path: '/workspace/d' }, path.join(dir, 'out'), {});
    expect(r).toMatchObject({ files: 1, directories: 2, symlinks: 1, bytes: 2 });
    expect(readlinkSync(path.join(dir, 'out/d/evil'))).toBe(outside);
    expect(statSync(path.join(dir, 'out/d/f')).mode & 0o777).toBe(0o640);
    expect(statSync(path.join(dir, 'out/d/sub')).mode & 0o777).toBe(0o700);
    // now the sandbox says evil is a directory holding bashrc: the host must not follow its own copy of the link
    const second = fakeApi(
      { '/workspace/d': [info('evil', FileType.FILE_TYPE_DIRECTORY)], '/workspace/d/evil': [info('bashrc', FileType.FILE_TYPE_REGULAR, { sizeBytes: 4 })] },
      { '/workspace/d/evil/bashrc': Buffer.from('evil') },
    );
    await expect(downloadTree(second, { sandboxId: ID, path: '/workspace/d' }, path.join(dir, 'out'), {})).rejects.toThrow(/symlink or not a directory/);
    expect(readFileSync(path.join(outside, 'bashrc'), 'utf8')).toBe('mine\n');
  });

  test('names that are paths ("..", "a/b") are refused before anything is written', async () => {
    for (const bad of ['..', 'a/../../x', '.']) {
      const api = fakeApi({ '/workspace/d': [info(bad, FileType.FILE_TYPE_REGULAR, { sizeBytes: 1 })] }, {});
      await expect(downloadTree(api, { sandboxId: ID, path: '/workspace/d' }, path.join(dir, 'out2'), {})).rejects.toThrow(/not a file name/);
    }
    expect(existsSync(path.join(dir, 'x'))).toBe(false);
  });
});

// attacker: a download killed with SIGKILL left its temp file for good; the next copy of that
// name removes the temp files of CLIs that are gone (pid and start ticks in the name)
describe('sweepDeadTemps', () => {
  it('removes the temp files of gone CLIs for that name only; keeps a live one and others', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'cli-sweep-'));
    try {
      const mine = `.f.txt.sandnode-download-${process.pid}.${processStartTicks(process.pid)}-0123456789ab`;
      const dead = `.f.txt.sandnode-download-${process.pid}.1-aaaaaaaaaaaa`; // same pid, other start: gone
      const gone = `.f.txt.sandnode-download-${2 ** 22 + 17}.5-bbbbbbbbbbbb`;
      const other = `.g.txt.sandnode-download-${2 ** 22 + 17}.5-cccccccccccc`;
      const oldStyle = '.f.txt.sandnode-download-dddddddddddd';
      for (const n of [mine, dead, gone, other, oldStyle, 'f.txt']) writeFileSync(path.join(dir, n), 'x');
      const fh = await open(dir, 'r');
      try {
        expect(await sweepDeadTemps(fh, 'f.txt')).toBe(2);
      } finally {
        await fh.close();
      }
      expect(readdirSync(dir).sort()).toEqual([mine, other, oldStyle, 'f.txt'].sort());
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

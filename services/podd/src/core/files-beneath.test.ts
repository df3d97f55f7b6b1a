import { existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FailedPreconditionError } from '@sandnode/shared';
import { createDirectory, createSymlink } from './file-tree';
import { readFileBeneath, writeFileBeneath } from './files-beneath';

// An attacker inside the sandbox makes /workspace/x a symlink out of /workspace (to / or /etc of
// the rootfs); podd (root) must neither create directories nor write files through it. The
// earlier WriteFile ran `mkdir -p` on the parent before its realpath check (directories made
// outside), and opened the file by path after the check (a swapped component redirected it).
describe('confined unary files and tree calls never go through a sandbox-made symlink', () => {
  let root: string;
  let ws: string;
  let outside: string;
  beforeEach(() => {
    root = mkdtempSync(path.join(tmpdir(), 'podd-beneath-'));
    ws = path.join(root, 'workspace');
    outside = path.join(root, 'outside');
    mkdirSync(ws);
    mkdirSync(outside);
    writeFileSync(path.join(outside, 'secret'), 'root only');
    symlinkSync(outside, path.join(ws, 'x'));
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  test('WriteFile with create_parents through a symlinked component makes nothing outside', async () => {
    await expect(writeFileBeneath(path.join(ws, 'x/made/f'), Buffer.from('hi'), { createParents: true, beneath: ws })).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(existsSync(path.join(outside, 'made'))).toBe(false);
  });

  test('WriteFile to a file behind a symlinked component is refused, the file untouched', async () => {
    await expect(writeFileBeneath(path.join(ws, 'x/secret'), Buffer.from('owned'), { beneath: ws })).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(readFileSync(path.join(outside, 'secret'), 'utf8')).toBe('root only');
  });

  test('WriteFile onto a final symlink is refused; a plain write works and sets its mode', async () => {
    symlinkSync(path.join(outside, 'secret'), path.join(ws, 'link'));
    await expect(writeFileBeneath(path.join(ws, 'link'), Buffer.from('owned'), { beneath: ws })).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(readFileSync(path.join(outside, 'secret'), 'utf8')).toBe('root only');
    await writeFileBeneath(path.join(ws, 'a/b/f'), Buffer.from('ok'), { createParents: true, beneath: ws, mode: 0o600 });
    expect(readFileSync(path.join(ws, 'a/b/f'), 'utf8')).toBe('ok');
    expect((await readFileBeneath(path.join(ws, 'a/b/f'), 0, 0, ws)).data.toString()).toBe('ok');
  });

  test('ReadFile behind a symlinked component is refused', async () => {
    await expect(readFileBeneath(path.join(ws, 'x/secret'), 0, 0, ws)).rejects.toBeInstanceOf(FailedPreconditionError);
  });

  test('CreateDirectory through or onto a symlink is refused; a new one gets its exact mode', async () => {
    await expect(createDirectory(path.join(ws, 'x/d'), 0o700, true, ws)).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(existsSync(path.join(outside, 'd'))).toBe(false);
    await expect(createDirectory(path.join(ws, 'x'), 0o777, false, ws)).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(statSync(outside).mode & 0o777).not.toBe(0o777);
    expect(await createDirectory(path.join(ws, 'd1'), 0o751, false, ws)).toEqual({ created: true });
    expect(statSync(path.join(ws, 'd1')).mode & 0o777).toBe(0o751);
  });

  test('CreateSymlink stores the target, never writes through x, replaces only on request', async () => {
    await expect(createSymlink(path.join(ws, 'x/l'), '/etc', false, true, ws)).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(existsSync(path.join(outside, 'l'))).toBe(false);
    await createSymlink(path.join(ws, 'l'), '../outside/secret', false, false, ws);
    await expect(createSymlink(path.join(ws, 'l'), '/etc', false, false, ws)).rejects.toBeInstanceOf(FailedPreconditionError);
    await createSymlink(path.join(ws, 'l'), '/etc', true, false, ws);
    expect(readlinkSync(path.join(ws, 'l'))).toBe('/etc');
  });
});

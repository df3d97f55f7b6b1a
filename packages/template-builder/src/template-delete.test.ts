import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { InvalidArgumentError } from '@sandnode/shared';
import { DELETED_PREFIX, MANIFEST_FILE, MANIFEST_FORMAT, ROOTFS_DIR, deleteTemplate, listTemplates } from './template-builder';

/** writeTemplate lays out a template the way buildTemplate leaves it (manifest + rootfs), without the parts a build needs. */
function writeTemplate(templatesDir: string, name: string): string {
  const dir = path.join(templatesDir, name);
  mkdirSync(path.join(dir, ROOTFS_DIR, 'bin'), { recursive: true });
  writeFileSync(path.join(dir, ROOTFS_DIR, 'bin', 'sh'), 'x');
  const manifest = { format: MANIFEST_FORMAT, name, poddVersion: '9.9.9', sizeBytes: 1, createdAtMs: 1, buildMs: 1, nodeVersion: 'v24.0.0', sources: { busybox: '', node: '', poddBundle: '' } };
  writeFileSync(path.join(dir, MANIFEST_FILE), JSON.stringify(manifest));
  return dir;
}

describe('deleteTemplate', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'tpl-delete-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  test('removes the template and returns it; the others stay', async () => {
    writeTemplate(dir, 'a');
    writeTemplate(dir, 'b');
    const t = await deleteTemplate(dir, 'a');
    expect(t).toMatchObject({ name: 'a', poddVersion: '9.9.9', rootfsPath: path.join(dir, 'a', ROOTFS_DIR) });
    expect(existsSync(path.join(dir, 'a'))).toBe(false);
    expect((await listTemplates(dir)).map((x) => x.name)).toEqual(['b']);
    expect(readdirSync(dir)).toEqual(['b']);
  });

  test('a missing template (or one without a rootfs) is undefined and changes nothing', async () => {
    expect(await deleteTemplate(dir, 'nope')).toBeUndefined();
    const half = writeTemplate(dir, 'half');
    rmSync(path.join(half, ROOTFS_DIR), { recursive: true });
    expect(await deleteTemplate(dir, 'half')).toBeUndefined();
    expect(existsSync(path.join(half, MANIFEST_FILE))).toBe(true);
  });

  test('bad names are INVALID_ARGUMENT and touch nothing outside', async () => {
    const outside = path.join(dir, 'outside');
    writeTemplate(outside, 'x');
    for (const name of ['', '../outside/x', 'a/b', '.deleted-x', 'Upper']) await expect(deleteTemplate(path.join(dir, 'tpl'), name)).rejects.toThrow(InvalidArgumentError);
    expect(existsSync(path.join(outside, 'x', MANIFEST_FILE))).toBe(true);
  });

  test('a symlink inside the rootfs is unlinked, never followed; leftovers of an interrupted delete go too', async () => {
    const victim = path.join(dir, 'victim');
    mkdirSync(victim);
    writeFileSync(path.join(victim, 'keep'), 'keep');
    const templatesDir = path.join(dir, 'templates');
    const t = writeTemplate(templatesDir, 'evil');
    symlinkSync(victim, path.join(t, ROOTFS_DIR, 'link'));
    const left = path.join(templatesDir, `${DELETED_PREFIX}old-1-1`);
    mkdirSync(path.join(left, 'x'), { recursive: true });
    await deleteTemplate(templatesDir, 'evil');
    expect(existsSync(path.join(victim, 'keep'))).toBe(true);
    expect(readdirSync(templatesDir)).toEqual([]);
  });
});

/** File-tree helpers of the builder: durable writes, fsync of a whole tree, sizes, stale temp trees. */
import { constants as fsConstants } from 'node:fs';
import { lstat, open, readdir, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { STALE_TEMP_MS } from './layout';

/** fsyncTree fsyncs every regular file and directory under root (children before parents). */
export async function fsyncTree(root: string): Promise<void> {
  for (const e of await readdir(root, { withFileTypes: true })) {
    const p = path.join(root, e.name);
    if (e.isDirectory()) await fsyncTree(p);
    else if (e.isFile()) await fsyncPath(p);
  }
  await fsyncPath(root);
}

/** treeSize is the sum of the sizes of the regular files under root, in bytes. */
export async function treeSize(root: string): Promise<number> {
  let n = 0;
  for (const e of await readdir(root, { withFileTypes: true })) {
    const p = path.join(root, e.name);
    if (e.isDirectory()) n += await treeSize(p);
    else if (e.isFile()) n += (await lstat(p)).size;
  }
  return n;
}

export async function fsyncPath(p: string): Promise<void> {
  const fh = await open(p, fsConstants.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** removeStale deletes leftover temp and old trees of earlier, interrupted builds. */
export async function removeStale(dir: string): Promise<void> {
  for (const n of await readdir(dir)) {
    if (!n.startsWith('.rootfs.tmp-') && !n.startsWith('.rootfs.old-')) continue;
    const p = path.join(dir, n);
    const st = await lstat(p).catch(() => undefined);
    if (st && (n.startsWith('.rootfs.old-') || Date.now() - st.mtimeMs > STALE_TEMP_MS)) await rm(p, { recursive: true, force: true });
  }
}

export async function exists(p: string): Promise<boolean> {
  return (await lstat(p).catch(() => undefined)) !== undefined;
}

export async function isFile(p: string): Promise<boolean> {
  return (await stat(p).catch(() => undefined))?.isFile() ?? false;
}

/**
 * Template builder: makes a sandbox template from local parts only (no network, a few
 * seconds): busybox-static with its applets, the running Node binary with the shared libraries
 * `ldd` lists, the podd bundle and the sandbox init.
 *
 * On disk:
 *   <templatesDir>/<name>/rootfs/          the root file system (see buildTemplate)
 *   <templatesDir>/<name>/manifest.json    name, podd version, size, timestamps (MANIFEST_FORMAT)
 *
 * The rootfs is built in a temp dir beside the final one (`.rootfs.tmp-*`), fsync'd, and renamed
 * into place, so a reader sees a whole template or none. Replace renames the old tree aside
 * (`.rootfs.old-*`), renames the new one in, writes the manifest, then deletes the old tree.
 * A crash between those renames leaves a rootfs without (or with a stale) manifest: it is not
 * listed (or shows the old podd version) until a build with replace runs again. Callers must not
 * replace a template that running sandboxes use (the catalog checks the records).
 */
import { chmod, mkdir, mkdtemp, readdir, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import { AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, writeFileAtomic } from '@sandnode/shared';
import { exists, fsyncPath, fsyncTree, removeStale, treeSize } from './fs-tree';
import { DEFAULT_BUSYBOX_PATH, MANIFEST_FILE, MANIFEST_FORMAT, ROOTFS_DIR, TEMPLATE_NAME_RE, validateName, type TemplateInfo, type TemplateManifest } from './layout';
import { checkParts, populate } from './rootfs';

export * from './layout';
export { initScript } from './init-script';
export { sharedLibraries } from './elf';

/** Options of {@link buildTemplate}; every path is an absolute (or cwd-relative) host path. */
export interface BuildTemplateOptions {
  /** Template name, matching TEMPLATE_NAME_RE. */
  name: string;
  /** Dir holding every template (`<stateDir>/templates`); created if missing. */
  templatesDir: string;
  /** The podd bundle (`services/podd/dist/podd.bundle.js`), copied to /opt/sandnode/podd.js. */
  poddBundlePath: string;
  /** Version of that podd, recorded in the manifest. */
  poddVersion: string;
  /** Static busybox binary; default /bin/busybox. */
  busyboxPath?: string;
  /**
   * Node binary copied to /usr/local/bin/node with its libraries (the server's `templateNode`);
   * default process.execPath. FailedPreconditionError when it is missing or older than
   * MIN_TEMPLATE_NODE_MAJOR.
   */
  nodePath?: string;
  /** Replace an existing template of that name (default false: ALREADY_EXISTS). */
  replace?: boolean;
}

/**
 * buildTemplate builds `<templatesDir>/<name>/rootfs/` and its manifest.json and returns the
 * template. The rootfs holds: /bin/busybox (static) and a symlink per applet of `busybox
 * --list` in /bin (plus /usr/bin/env); /usr/local/bin/node and every library `ldd` lists for it
 * (and the dynamic loader) at the same paths, directory symlinks of the host (merged /usr)
 * included; /opt/sandnode/podd.js; /sbin/sandnode-init (see {@link initScript});
 * /etc/{passwd,group,hosts,nsswitch.conf,hostname}; empty /proc /sys /dev /tmp (1777) /var/tmp
 * /workspace /run/sandnode /root.
 *
 * Errors: InvalidArgumentError naming `name` (bad name) or `poddVersion` (empty);
 * AlreadyExistsError when the template exists and replace is false; FailedPreconditionError
 * naming the missing or unusable part and how to get it (busybox: `apt-get install
 * busybox-static`; podd bundle: `npm run build`; ldd: `apt-get install libc-bin`);
 * InternalError when a host command fails. Nothing is left behind on failure, and a replaced
 * template stays as it was.
 */
export async function buildTemplate(opts: BuildTemplateOptions): Promise<TemplateInfo> {
  const t0 = Date.now();
  validateName(opts.name);
  if (!opts.poddVersion) throw new InvalidArgumentError('poddVersion: must not be empty');
  const busyboxPath = path.resolve(opts.busyboxPath ?? DEFAULT_BUSYBOX_PATH);
  const nodePath = path.resolve(opts.nodePath ?? process.execPath);
  const bundlePath = path.resolve(opts.poddBundlePath);
  await checkParts(busyboxPath, nodePath, bundlePath);

  const templatesDir = path.resolve(opts.templatesDir);
  const dir = path.join(templatesDir, opts.name);
  const rootfs = path.join(dir, ROOTFS_DIR);
  const manifestPath = path.join(dir, MANIFEST_FILE);
  if (!opts.replace && ((await exists(rootfs)) || (await exists(manifestPath)))) {
    throw new AlreadyExistsError(`template ${opts.name} already exists at ${dir}; build it with replace to rebuild it`);
  }
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await removeStale(dir);

  const tmp = await mkdtemp(path.join(dir, '.rootfs.tmp-'));
  let old: string | undefined;
  let swapped = false;
  try {
    await chmod(tmp, 0o755);
    const nodeVersion = await populate(tmp, { busyboxPath, nodePath, bundlePath });
    await fsyncTree(tmp);
    const sizeBytes = await treeSize(tmp);

    if (opts.replace && (await exists(rootfs))) {
      old = path.join(dir, `.rootfs.old-${process.pid}-${Date.now()}`);
      await rename(rootfs, old);
    }
    try {
      await rename(tmp, rootfs);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOTEMPTY' || code === 'EEXIST') throw new AlreadyExistsError(`template ${opts.name} was created by someone else while building`);
      throw err;
    }
    swapped = true;
    const createdAtMs = Date.now();
    const manifest: TemplateManifest = {
      format: MANIFEST_FORMAT,
      name: opts.name,
      poddVersion: opts.poddVersion,
      sizeBytes,
      createdAtMs,
      buildMs: createdAtMs - t0,
      nodeVersion,
      sources: { busybox: busyboxPath, node: nodePath, poddBundle: bundlePath },
    };
    writeFileAtomic(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`, 0o644);
    await fsyncPath(dir);
    return toInfo(manifest, rootfs);
  } catch (err) {
    if (!swapped) {
      await rm(tmp, { recursive: true, force: true });
      if (old) await rename(old, rootfs).catch(() => undefined); // put the old template back
      old = undefined;
    }
    throw err;
  } finally {
    if (old) await rm(old, { recursive: true, force: true });
  }
}

/**
 * readTemplate returns the template `name` in templatesDir, or undefined when it has no
 * manifest or no rootfs (not built, or a build was interrupted). Throws InvalidArgumentError
 * naming `name` for a bad name and FailedPreconditionError when the manifest is unreadable or of
 * a newer format (rebuild it with replace).
 */
export async function readTemplate(templatesDir: string, name: string): Promise<TemplateInfo | undefined> {
  validateName(name);
  const dir = path.join(path.resolve(templatesDir), name);
  let raw: string;
  try {
    raw = await readFile(path.join(dir, MANIFEST_FILE), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  let m: Partial<TemplateManifest>;
  try {
    m = JSON.parse(raw) as Partial<TemplateManifest>;
  } catch {
    throw new FailedPreconditionError(`template ${name}: ${MANIFEST_FILE} is not valid JSON; rebuild it with replace`);
  }
  if (typeof m.format !== 'number' || m.format > MANIFEST_FORMAT) {
    throw new FailedPreconditionError(`template ${name}: manifest format ${String(m.format)} is not one this release reads (${MANIFEST_FORMAT}); rebuild it with replace`);
  }
  if (m.name !== name || typeof m.poddVersion !== 'string') {
    throw new FailedPreconditionError(`template ${name}: manifest does not describe this template; rebuild it with replace`);
  }
  const rootfs = path.join(dir, ROOTFS_DIR);
  if (!(await exists(rootfs))) return undefined;
  return toInfo(m as TemplateManifest, rootfs);
}

/**
 * listTemplates returns every readable template in templatesDir, sorted by name; an empty list
 * when the dir does not exist. Dirs with bad names, no manifest or an unreadable one are skipped.
 */
export async function listTemplates(templatesDir: string): Promise<TemplateInfo[]> {
  let names: string[];
  try {
    names = await readdir(path.resolve(templatesDir));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const out: TemplateInfo[] = [];
  for (const n of names.sort()) {
    if (!TEMPLATE_NAME_RE.test(n)) continue;
    const t = await readTemplate(templatesDir, n).catch(() => undefined);
    if (t) out.push(t);
  }
  return out;
}

/** Prefix of a deleted template's dir while it is removed (beside the templates; never a template name). */
export const DELETED_PREFIX = '.deleted-';

/**
 * deleteTemplate removes the template `name` from templatesDir and returns it as it was, or
 * undefined when there is none (no manifest or no rootfs). The template's dir is first renamed
 * to a `.deleted-*` name beside it (one rename: a reader sees the whole template or none), then
 * removed; symlinks inside are unlinked, never followed. Dirs of deletes a crash interrupted are
 * removed too. Throws InvalidArgumentError for a bad name and FailedPreconditionError for an
 * unreadable manifest (see readTemplate). The caller makes sure no sandbox uses the template.
 */
export async function deleteTemplate(templatesDir: string, name: string): Promise<TemplateInfo | undefined> {
  const root = path.resolve(templatesDir);
  const t = await readTemplate(root, name);
  if (!t) return undefined;
  const gone = path.join(root, `${DELETED_PREFIX}${name}-${process.pid}-${Date.now()}`);
  await rename(path.join(root, name), gone);
  await fsyncPath(root);
  for (const n of await readdir(root)) {
    if (n.startsWith(DELETED_PREFIX)) await rm(path.join(root, n), { recursive: true, force: true });
  }
  return t;
}

function toInfo(m: TemplateManifest, rootfsPath: string): TemplateInfo {
  return { name: m.name, poddVersion: m.poddVersion, rootfsPath, sizeBytes: m.sizeBytes, createdAtMs: m.createdAtMs, buildMs: m.buildMs };
}

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
import { execFile } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { chmod, copyFile, lstat, mkdir, mkdtemp, open, readdir, readFile, readlink, realpath, rename, rm, stat, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { AlreadyExistsError, FailedPreconditionError, InternalError, InvalidArgumentError } from '@sandnode/shared';
import type { TemplateInfo } from './types';

export type { TemplateInfo };

/** Template names: lower-case letters, digits, `.`, `_`, `-`; 1..63 chars; starts with a letter or digit. */
export const TEMPLATE_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** Version of manifest.json this builder writes and reads. */
export const MANIFEST_FORMAT = 1;
/** Name of the rootfs dir inside a template dir. */
export const ROOTFS_DIR = 'rootfs';
/** Name of the manifest inside a template dir. */
export const MANIFEST_FILE = 'manifest.json';
/** Default busybox binary (Debian: `apt-get install busybox-static`). */
export const DEFAULT_BUSYBOX_PATH = '/bin/busybox';

/** Paths inside the rootfs (the contract between templates, the init, podd and the drivers). */
export const ROOTFS_PATHS = {
  busybox: '/bin/busybox',
  node: '/usr/local/bin/node',
  podd: '/opt/sandnode/podd.js',
  init: '/sbin/sandnode-init',
  poddSocket: '/run/sandnode/podd.sock',
  poddLog: '/run/sandnode/podd.log',
} as const;

/** Empty dirs every rootfs has, with their modes. */
const EMPTY_DIRS: Array<[string, number]> = [
  ['/proc', 0o555],
  ['/sys', 0o555],
  ['/dev', 0o755],
  ['/tmp', 0o1777],
  ['/var/tmp', 0o1777],
  ['/workspace', 0o755],
  ['/run/sandnode', 0o755],
  ['/root', 0o700],
  ['/etc', 0o755],
  ['/bin', 0o755],
  ['/sbin', 0o755],
  ['/usr/bin', 0o755],
  ['/usr/local/bin', 0o755],
  ['/opt/sandnode', 0o755],
];

/** Oldest Node major a template may carry (the podd bundle targets node24; engines >=22). */
export const MIN_TEMPLATE_NODE_MAJOR = 22;

/** Leftover temp/old trees older than this are removed by the next build of the name, in ms. */
const STALE_TEMP_MS = 10 * 60 * 1000;

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

/** The manifest.json of a template. */
export interface TemplateManifest {
  format: number;
  name: string;
  poddVersion: string;
  /** Sum of the sizes of the rootfs's regular files, bytes. */
  sizeBytes: number;
  /** When the build finished, Unix epoch ms. */
  createdAtMs: number;
  /** How long the build took, ms. */
  buildMs: number;
  /** `node --version` of the copied Node binary. */
  nodeVersion: string;
  /** Host paths the parts came from. */
  sources: { busybox: string; node: string; poddBundle: string };
}

/**
 * validateName throws InvalidArgumentError (gRPC INVALID_ARGUMENT) naming `name` unless
 * name matches TEMPLATE_NAME_RE.
 */
export function validateName(name: string): void {
  if (typeof name !== 'string' || !TEMPLATE_NAME_RE.test(name)) {
    throw new InvalidArgumentError(`name: ${JSON.stringify(name)} is not a template name (${TEMPLATE_NAME_RE.source})`);
  }
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
    await writeFileDurably(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
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

/**
 * initScript is /sbin/sandnode-init, PID 1 of a sandbox: a busybox sh script that runs podd in
 * the background (stdout and stderr appended to /run/sandnode/podd.log), restarts it when it
 * dies (backoff 0.2 s, 0.5 s, 1 s, 2 s, then 5 s; reset after 10 s of uptime) with the init's
 * pid unchanged, reaps orphans (busybox ash waits with waitpid(-1)), and on SIGTERM or SIGINT
 * sends TERM to podd, waits for it (SIGKILL after 10 s) and exits 0.
 */
export function initScript(): string {
  const p = ROOTFS_PATHS;
  return `#!/bin/busybox sh
# sandnode-init: PID 1 of a sandnode sandbox (written by the template builder).
# Runs podd, restarts it when it dies, reaps orphans; SIGTERM/SIGINT: TERM podd, exit 0.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=\${HOME:-/root}
LOG=${p.poddLog}
mkdir -p ${path.dirname(p.poddSocket)}
podd=0
stopping=0
log() { echo "sandnode-init[$$] $(date -u +%Y-%m-%dT%H:%M:%SZ): $*" >>"$LOG"; }
on_term() {
  stopping=1
  if [ "$podd" -gt 0 ]; then
    kill -TERM "$podd" 2>/dev/null
    ( sleep 10; kill -KILL "$podd" 2>/dev/null ) &
  fi
}
trap on_term TERM INT
delay=0
log "starting"
while [ "$stopping" = 0 ]; do
  started=$(date +%s)
  # podd serves fd 3 when the host hands in its socket (SANDNODE_PODD_LISTEN_FD=3); --socket
  # is the fallback for a runtime that does not.
  ${p.node} ${p.podd} --socket ${p.poddSocket} </dev/null >>"$LOG" 2>&1 &
  podd=$!
  log "podd started, pid $podd"
  # wait returns early when a trapped signal arrives: wait again until podd is gone.
  while :; do
    wait "$podd"
    status=$?
    kill -0 "$podd" 2>/dev/null || break
  done
  podd=0
  [ "$stopping" = 0 ] || break
  ran=$(( $(date +%s) - started ))
  if [ "$ran" -ge 10 ]; then delay=0; fi
  case "$delay" in
    0) delay=0.2 ;;
    0.2) delay=0.5 ;;
    0.5) delay=1 ;;
    1) delay=2 ;;
    *) delay=5 ;;
  esac
  log "podd exited with status $status after \${ran}s; restarting in \${delay}s"
  sleep "$delay" &
  wait $!
done
log "stopped"
exit 0
`;
}

// ---------------------------------------------------------------------------------------------

/** checkParts fails with FailedPreconditionError naming a missing part and how to get it. */
async function checkParts(busyboxPath: string, nodePath: string, bundlePath: string): Promise<void> {
  if (!(await isFile(busyboxPath))) {
    throw new FailedPreconditionError(`busybox not found at ${busyboxPath}: install it with \`apt-get install busybox-static\``);
  }
  const kind = await elfLinkage(busyboxPath);
  if (kind !== 'static') {
    throw new FailedPreconditionError(
      `busybox at ${busyboxPath} is ${kind === 'dynamic' ? 'dynamically linked' : 'not an ELF binary'}: install the static one with \`apt-get install busybox-static\``,
    );
  }
  if (!(await isFile(bundlePath))) {
    throw new FailedPreconditionError(`podd bundle not found at ${bundlePath}: build it with \`npm run build\` (or \`npx tsc -b services/podd/tsconfig.build.json && npm run bundle --workspace @sandnode/podd\`)`);
  }
  if (!(await isFile(nodePath))) throw new FailedPreconditionError(`node binary not found at ${nodePath} (server config key templateNode)`);
  const v = (await runHost(nodePath, ['--version']).catch((err: Error) => `(${err.message})`)).trim();
  const major = /^v(\d+)\./.exec(v)?.[1];
  if (!major || Number(major) < MIN_TEMPLATE_NODE_MAJOR) {
    throw new FailedPreconditionError(`node at ${nodePath} is ${v}: templates need Node >= ${MIN_TEMPLATE_NODE_MAJOR} (podd is bundled for node24; server config key templateNode, deploy/host-setup.sh provides Node 24)`);
  }
}

/** populate writes every part into root (a fresh dir); returns the Node version. */
async function populate(root: string, parts: { busyboxPath: string; nodePath: string; bundlePath: string }): Promise<string> {
  const at = (p: string) => path.join(root, p);
  for (const [d, mode] of EMPTY_DIRS) {
    await mkdir(at(d), { recursive: true, mode: 0o755 });
    await chmod(at(d), mode);
  }
  for (const d of ['/usr', '/usr/local', '/opt', '/run', '/var']) await chmod(at(d), 0o755);

  // busybox and its applets
  await copyFile(parts.busyboxPath, at(ROOTFS_PATHS.busybox));
  await chmod(at(ROOTFS_PATHS.busybox), 0o755);
  const list = await runHost(parts.busyboxPath, ['--list']);
  for (const applet of list.split('\n').map((s) => s.trim())) {
    if (!applet || applet === 'busybox' || applet.includes('/')) continue;
    await symlink('busybox', at(`/bin/${applet}`));
  }
  await symlink(ROOTFS_PATHS.busybox, at('/usr/bin/env'));

  // node and its shared libraries, at the paths the host has them
  await copyFile(await realpath(parts.nodePath), at(ROOTFS_PATHS.node));
  await chmod(at(ROOTFS_PATHS.node), 0o755);
  for (const lib of await sharedLibraries(parts.nodePath)) await installHostPath(root, lib);
  const nodeVersion = (await runHost(parts.nodePath, ['--version'])).trim();

  // podd and the init
  await copyFile(parts.bundlePath, at(ROOTFS_PATHS.podd));
  await chmod(at(ROOTFS_PATHS.podd), 0o644);
  // The descriptor set for podd's server reflection, where shared's loader looks for it
  // (<bundle dir>/../descriptor/sandnode.binpb). Optional: without it reflection lists nothing.
  const descriptor = reflectionDescriptor();
  if (descriptor) {
    await mkdir(at('/opt/descriptor'), { recursive: true });
    await copyFile(descriptor, at('/opt/descriptor/sandnode.binpb'));
  }
  await writeFile(at(ROOTFS_PATHS.init), initScript(), { mode: 0o755 });
  await chmod(at(ROOTFS_PATHS.init), 0o755);

  // /etc
  const etc: Array<[string, string]> = [
    ['passwd', 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n'],
    ['group', 'root:x:0:\nnogroup:x:65534:\n'],
    ['hosts', '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'],
    ['nsswitch.conf', 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n'],
    ['hostname', 'sandbox\n'],
  ];
  for (const [f, content] of etc) await writeFile(at(`/etc/${f}`), content, { mode: 0o644 });
  return nodeVersion;
}

/**
 * sharedLibraries returns the absolute paths `ldd` lists for binary (loader included, vdso
 * excluded); [] for a static binary. FailedPreconditionError when ldd is missing or a library is
 * "not found".
 */
export async function sharedLibraries(binary: string): Promise<string[]> {
  let out: string;
  try {
    out = await runHost('ldd', [binary]);
  } catch (err) {
    const msg = (err as Error).message;
    if (/not a dynamic executable|statically linked/.test(msg)) return [];
    if ((err as { notFound?: boolean }).notFound) throw new FailedPreconditionError('ldd not found: install it with `apt-get install libc-bin`');
    throw err;
  }
  const libs: string[] = [];
  for (const line of out.split('\n')) {
    const l = line.trim();
    if (!l || /statically linked/.test(l)) continue;
    const missing = /^(\S+) => not found/.exec(l);
    if (missing) throw new FailedPreconditionError(`${binary} needs ${missing[1]}, which ldd cannot find`);
    const m = /=>\s+(\/\S+)/.exec(l) ?? /^(\/\S+)/.exec(l);
    if (m?.[1]) libs.push(m[1]);
  }
  return libs;
}

/**
 * installHostPath copies the host file hostPath into root at the same path, recreating every
 * symlink met on the way (a merged-/usr `/lib -> usr/lib`, the loader's own link) and copying
 * their targets too, so the same path resolves inside the rootfs. It never writes through a
 * symlink of the rootfs.
 */
async function installHostPath(root: string, hostPath: string, depth = 0): Promise<void> {
  if (depth > 16) throw new InternalError(`too many symlinks resolving ${hostPath}`);
  const parts = hostPath.split('/').filter(Boolean);
  let cur = '/';
  for (let i = 0; i < parts.length; i++) {
    const hp = path.join(cur, parts[i] as string);
    const dst = path.join(root, hp);
    const st = await lstat(hp);
    const have = await lstat(dst).catch(() => undefined);
    if (st.isSymbolicLink()) {
      const link = await readlink(hp);
      if (!have) {
        await symlink(link, dst);
      } else if (!have.isSymbolicLink()) {
        // The rootfs has a real entry here (e.g. /bin): copy the target at this path instead.
        if (i === parts.length - 1) {
          await copyRegular(await realpath(hp), dst);
          return;
        }
        cur = hp;
        continue;
      }
      const target = path.resolve(path.dirname(hp), link);
      await installHostPath(root, path.join(target, ...parts.slice(i + 1)), depth + 1);
      return;
    }
    if (st.isDirectory()) {
      if (!have) {
        await mkdir(dst);
        await chmod(dst, st.mode & 0o7777);
      } else if (!have.isDirectory()) {
        throw new InternalError(`rootfs ${hp} is not a directory but the host's is`);
      }
      cur = hp;
      continue;
    }
    if (st.isFile()) {
      if (!have) await copyRegular(hp, dst);
      return;
    }
    throw new InternalError(`cannot copy ${hp}: not a regular file, directory or symlink`);
  }
}

async function copyRegular(src: string, dst: string): Promise<void> {
  const st = await stat(src);
  await copyFile(src, dst);
  await chmod(dst, st.mode & 0o7777);
}

/** fsyncTree fsyncs every regular file and directory under root (children before parents). */
async function fsyncTree(root: string): Promise<void> {
  for (const e of await readdir(root, { withFileTypes: true })) {
    const p = path.join(root, e.name);
    if (e.isDirectory()) await fsyncTree(p);
    else if (e.isFile()) await fsyncPath(p);
  }
  await fsyncPath(root);
}

/** treeSize is the sum of the sizes of the regular files under root, in bytes. */
async function treeSize(root: string): Promise<number> {
  let n = 0;
  for (const e of await readdir(root, { withFileTypes: true })) {
    const p = path.join(root, e.name);
    if (e.isDirectory()) n += await treeSize(p);
    else if (e.isFile()) n += (await lstat(p)).size;
  }
  return n;
}

async function fsyncPath(p: string): Promise<void> {
  const fh = await open(p, fsConstants.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** writeFileDurably writes content to p via a fsync'd temp file renamed over it. */
async function writeFileDurably(p: string, content: string): Promise<void> {
  const tmp = `${p}.tmp-${process.pid}`;
  const fh = await open(tmp, 'w', 0o644);
  try {
    await fh.writeFile(content);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, p);
}

/** removeStale deletes leftover temp and old trees of earlier, interrupted builds. */
async function removeStale(dir: string): Promise<void> {
  for (const n of await readdir(dir)) {
    if (!n.startsWith('.rootfs.tmp-') && !n.startsWith('.rootfs.old-')) continue;
    const p = path.join(dir, n);
    const st = await lstat(p).catch(() => undefined);
    if (st && (n.startsWith('.rootfs.old-') || Date.now() - st.mtimeMs > STALE_TEMP_MS)) await rm(p, { recursive: true, force: true });
  }
}

function toInfo(m: TemplateManifest, rootfsPath: string): TemplateInfo {
  return { name: m.name, poddVersion: m.poddVersion, rootfsPath, sizeBytes: m.sizeBytes, createdAtMs: m.createdAtMs, buildMs: m.buildMs };
}

async function exists(p: string): Promise<boolean> {
  return (await lstat(p).catch(() => undefined)) !== undefined;
}

async function isFile(p: string): Promise<boolean> {
  return (await stat(p).catch(() => undefined))?.isFile() ?? false;
}

/** elfLinkage reads the ELF program headers: 'dynamic' when there is a PT_INTERP. */
async function elfLinkage(p: string): Promise<'static' | 'dynamic' | 'not-elf'> {
  const fh = await open(p, 'r');
  try {
    const hdr = Buffer.alloc(64);
    await fh.read(hdr, 0, 64, 0);
    if (hdr.readUInt32BE(0) !== 0x7f454c46) return 'not-elf';
    const is64 = hdr[4] === 2;
    const le = hdr[5] === 1;
    const u16 = (b: Buffer, o: number) => (le ? b.readUInt16LE(o) : b.readUInt16BE(o));
    const u32 = (b: Buffer, o: number) => (le ? b.readUInt32LE(o) : b.readUInt32BE(o));
    const phoff = is64 ? Number(le ? hdr.readBigUInt64LE(0x20) : hdr.readBigUInt64BE(0x20)) : u32(hdr, 0x1c);
    const phentsize = u16(hdr, is64 ? 0x36 : 0x2a);
    const phnum = u16(hdr, is64 ? 0x38 : 0x2c);
    const ph = Buffer.alloc(phentsize * phnum);
    await fh.read(ph, 0, ph.length, phoff);
    for (let i = 0; i < phnum; i++) if (u32(ph, i * phentsize) === 3 /* PT_INTERP */) return 'dynamic';
    return 'static';
  } finally {
    await fh.close();
  }
}

/** runHost runs a host command (no shell) and returns its stdout; InternalError naming it on failure. */
function runHost(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: 30_000, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) {
        const e = new InternalError(`${cmd} ${args.join(' ')} failed: ${String(stderr).trim() || String(stdout).trim() || err.message}`);
        (e as { notFound?: boolean }).notFound = (err as NodeJS.ErrnoException).code === 'ENOENT';
        reject(e);
        return;
      }
      resolve(String(stdout));
    });
  });
}

/** reflectionDescriptor finds the descriptor set `npm run gen` writes, or undefined. */
function reflectionDescriptor(): string | undefined {
  try {
    return require.resolve('@sandnode/shared/descriptor');
  } catch {
    return undefined;
  }
}

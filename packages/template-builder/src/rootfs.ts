/**
 * Rootfs population: checks the host parts (static busybox, the Node binary, the podd bundle)
 * and writes them, the libraries the Node binary needs (at their host paths, symlinks
 * recreated), /etc and the init into a fresh rootfs dir.
 */
import { chmod, copyFile, lstat, mkdir, readlink, realpath, stat, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { FailedPreconditionError, InternalError } from '@sandnode/shared';
import { elfLinkage, runHost, sharedLibraries } from './elf';
import { isFile } from './fs-tree';
import { initScript } from './init-script';
import { EMPTY_DIRS, MIN_TEMPLATE_NODE_MAJOR, ROOTFS_PATHS } from './layout';
import { buildCompileCache, poddBootScript } from './podd-boot';

/** checkParts fails with FailedPreconditionError naming a missing part and how to get it. */
export async function checkParts(busyboxPath: string, nodePath: string, bundlePath: string): Promise<void> {
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
    throw new FailedPreconditionError(
      `podd bundle not found at ${bundlePath}: build it with \`npm run build\` (or \`npx tsc -b services/podd/tsconfig.build.json && npm run bundle --workspace @sandnode/podd\`)`,
    );
  }
  if (!(await isFile(nodePath))) throw new FailedPreconditionError(`node binary not found at ${nodePath} (server config key templateNode)`);
  const v = (await runHost(nodePath, ['--version']).catch((err: Error) => `(${err.message})`)).trim();
  const major = /^v(\d+)\./.exec(v)?.[1];
  if (!major || Number(major) < MIN_TEMPLATE_NODE_MAJOR) {
    throw new FailedPreconditionError(
      `node at ${nodePath} is ${v}: templates need Node >= ${MIN_TEMPLATE_NODE_MAJOR} (podd is bundled for node24; server config key templateNode, deploy/host-setup.sh provides Node 24)`,
    );
  }
}

/** populate writes every part into root (a fresh dir); returns the Node version. */
export async function populate(root: string, parts: { busyboxPath: string; nodePath: string; bundlePath: string }): Promise<string> {
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
  // koffi's native module beside the bundle (podd's pty exec), with its shared libraries.
  // Optional: without it podd does not list podd.exec-pty.v1.
  const koffi = path.join(path.dirname(parts.bundlePath), 'koffi.node');
  if (await isFile(koffi)) {
    await copyFile(koffi, at(path.join(path.dirname(ROOTFS_PATHS.podd), 'koffi.node')));
    for (const lib of await sharedLibraries(koffi)) await installHostPath(root, lib);
  }
  // The descriptor set for podd's server reflection, where shared's loader looks for it
  // (<bundle dir>/../descriptor/sandnode.binpb). Optional: without it reflection lists nothing.
  const descriptor = reflectionDescriptor();
  if (descriptor) {
    await mkdir(at('/opt/descriptor'), { recursive: true });
    await copyFile(descriptor, at('/opt/descriptor/sandnode.binpb'));
  }
  // podd's boot and its V8 code cache (podd-boot.ts): made by the template's Node, after podd's parts are in
  await writeFile(at(ROOTFS_PATHS.poddBoot), poddBootScript(), { mode: 0o644 });
  await buildCompileCache(root, parts.nodePath, nodeVersion);
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

/** reflectionDescriptor finds the descriptor set `npm run gen` writes, or undefined. */
function reflectionDescriptor(): string | undefined {
  try {
    return require.resolve('@sandnode/shared/descriptor');
  } catch {
    return undefined;
  }
}

/**
 * DriverBinaries: versioned copies of the driver binaries under
 * `<stateDir>/vmm-supervisor/bin/<driver>-<version>/<binary>` (e.g. `runc-1.1.5+ds1/runc`).
 * A VM is always managed by the copy it was started with, so an upgrade of the host package
 * never changes the binary of a running VM. Dirs no VM uses (and not the current one) are
 * pruned.
 */
import { chmodSync, closeSync, copyFileSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, renameSync, rmSync } from 'node:fs';
import path from 'node:path';

/** Dir of the versioned binaries inside the state dir. */
export const DRIVER_BIN_DIR = 'vmm-supervisor/bin';

/** versionDirName is `<driver>-<version>` with characters unsafe in a file name replaced by "_". */
export function versionDirName(driver: string, version: string): string {
  return `${driver}-${version}`.replace(/[^A-Za-z0-9._+-]/g, '_');
}

/** DriverBinaries manages the versioned copies in one dir. */
export class DriverBinaries {
  /** dir holds one `<driver>-<version>/` subdir per copy. */
  constructor(readonly dir: string) {}

  /** forStateDir returns the store at `<stateDir>/vmm-supervisor/bin`. */
  static forStateDir(stateDir: string): DriverBinaries {
    return new DriverBinaries(path.join(path.resolve(stateDir), DRIVER_BIN_DIR));
  }

  /**
   * install copies source to `<dir>/<driver>-<version>/<basename(source)>` unless that file
   * exists, and returns its path. The copy is written to a temp name, fsynced and renamed, so
   * a crash never leaves a half-written binary under the final name.
   */
  install(driver: string, version: string, source: string): string {
    const vdir = path.join(this.dir, versionDirName(driver, version));
    const target = path.join(vdir, path.basename(source));
    if (existsSync(target)) return target;
    mkdirSync(vdir, { recursive: true, mode: 0o755 });
    const tmp = `${target}.tmp-${process.pid}`;
    copyFileSync(source, tmp);
    chmodSync(tmp, 0o755);
    const fd = openSync(tmp, 'r');
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, target);
    const dfd = openSync(vdir, 'r');
    try {
      fsyncSync(dfd);
    } finally {
      closeSync(dfd);
    }
    return target;
  }

  /** list returns the names of the version dirs present, sorted. */
  list(): string[] {
    if (!existsSync(this.dir)) return [];
    return readdirSync(this.dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
  }

  /**
   * prune removes every version dir that none of `inUse` (binary paths of VMs in the table
   * and the current binary) lies in. Paths outside this store are ignored. Returns the names
   * of the removed dirs.
   */
  prune(inUse: Iterable<string>): string[] {
    const keep = new Set<string>();
    for (const p of inUse) {
      if (!p) continue;
      const rel = path.relative(this.dir, path.resolve(p));
      if (rel.startsWith('..') || path.isAbsolute(rel)) continue;
      const first = rel.split(path.sep)[0];
      if (first) keep.add(first);
    }
    const removed: string[] = [];
    for (const name of this.list()) {
      if (keep.has(name)) continue;
      rmSync(path.join(this.dir, name), { recursive: true, force: true });
      removed.push(name);
    }
    return removed;
  }
}

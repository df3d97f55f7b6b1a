/**
 * Which cgroup hierarchy the host has, told the way runc tells it (libcontainer/cgroups
 * IsCgroup2UnifiedMode / IsCgroup2HybridMode): statfs(2) of `/sys/fs/cgroup`.
 *
 *   unified  `/sys/fs/cgroup` is a cgroup2 filesystem (CGROUP2_SUPER_MAGIC): every controller
 *            is in v2; runc puts a container's cgroup at `/sys/fs/cgroup/<cgroupsPath>`.
 *   hybrid   `/sys/fs/cgroup` is a tmpfs of v1 hierarchies and `/sys/fs/cgroup/unified` is a
 *            cgroup2 mount (systemd's hybrid layout): the controllers (memory, pids, freezer,
 *            blkio ...) are v1; runc also puts the container in the v2 tree (its state's
 *            cgroup_paths[""]), where only the core files work (cgroup.freeze, cgroup.kill,
 *            cgroup.events, cpu.stat) and what cgroup.controllers lists. runc itself pauses
 *            with the v1 freezer here, and so does this driver.
 *   legacy   v1 only.
 *
 * The machines sandnode is developed on are hybrid (README "cgroup v1 and v2").
 */
import { readdirSync, readFileSync, statfsSync } from 'node:fs';
import path from 'node:path';

/** f_type of a cgroup2 filesystem (linux/magic.h). */
export const CGROUP2_SUPER_MAGIC = 0x63677270;
/** The cgroup filesystem root of the host. */
export const CGROUP_ROOT = '/sys/fs/cgroup';
/** Where a hybrid host mounts its cgroup2 tree, below {@link CGROUP_ROOT}. */
export const HYBRID_UNIFIED_DIR = 'unified';

/** The host's cgroup layout (see the file header). */
export type CgroupMode = 'unified' | 'hybrid' | 'legacy';

/** CgroupHierarchy: the mode and the cgroup2 mount point (undefined in legacy mode). */
export interface CgroupHierarchy {
  mode: CgroupMode;
  /** The cgroup2 mount: `/sys/fs/cgroup` (unified), `/sys/fs/cgroup/unified` (hybrid); undefined when none. */
  v2Root: string | undefined;
}

/** fsType is statfs(2)'s f_type of p, undefined when statfs fails (no such dir). */
export function fsType(p: string): number | undefined {
  try {
    return statfsSync(p).type;
  } catch {
    return undefined;
  }
}

/**
 * detectCgroupHierarchy tells the host's cgroup mode as runc does: root is cgroup2 -> unified;
 * else `<root>/unified` is cgroup2 -> hybrid; else legacy (also when root cannot be statfs'ed).
 * typeOf is injectable for unit tests (default {@link fsType}).
 */
export function detectCgroupHierarchy(root = CGROUP_ROOT, typeOf: (p: string) => number | undefined = fsType): CgroupHierarchy {
  if (typeOf(root) === CGROUP2_SUPER_MAGIC) return { mode: 'unified', v2Root: root };
  const unified = path.join(root, HYBRID_UNIFIED_DIR);
  if (typeOf(unified) === CGROUP2_SUPER_MAGIC) return { mode: 'hybrid', v2Root: unified };
  return { mode: 'legacy', v2Root: undefined };
}

/** controllersOf lists the controllers of the cgroup2 dir (its cgroup.controllers); [] when unreadable. */
export function controllersOf(dir: string): string[] {
  try {
    return readFileSync(path.join(dir, 'cgroup.controllers'), 'utf8').split(/\s+/).filter(Boolean);
  } catch {
    return [];
  }
}

/**
 * cgroup2Offers says whether the cgroup2 tree at v2Root offers controller and, in a cgroup that
 * has it, one of files: the controller is listed in the root's cgroup.controllers and some
 * direct child of the root (where runc makes `/sandnode` and systemd its slices) has one of
 * the files. The root cgroup itself has no memory.max, io.weight ... files, so a child is asked.
 * False when it cannot tell (no child with the controller yet): the caller leaves the setting
 * out, as it does where the host offers nothing. Reads the host's own cgroup tree only.
 */
export function cgroup2Offers(v2Root: string, controller: string, files: readonly string[]): boolean {
  if (!controllersOf(v2Root).includes(controller)) return false;
  let children: string[];
  try {
    children = readdirSync(v2Root, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => path.join(v2Root, e.name));
  } catch {
    return false;
  }
  return children.some((c) =>
    files.some((f) => {
      try {
        readFileSync(path.join(c, f), 'utf8');
        return true;
      } catch {
        return false;
      }
    }),
  );
}

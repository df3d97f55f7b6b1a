/**
 * Prerequisites of integration tests, and the one rule for a missing one: a suite whose
 * machine lacks a part **skips with a message naming it**, except under `CI=true` when the
 * part is one that `.ci/run` installs (root, runc, busybox-static, e2fsprogs, loop devices,
 * a Docker engine, the build itself): then the suite **fails**, so CI can never pass by
 * skipping what it was meant to run. Parts CI cannot have here (`/dev/ublk-control`, a
 * firecracker binary and images) skip everywhere.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, statfsSync } from 'node:fs';
import path from 'node:path';

/** One thing a suite needs from the machine. */
export interface Part {
  /** what it is and how to get it, e.g. "runc (apt-get install runc)" */
  name: string;
  /** true when the machine has it */
  present(): boolean;
  /** whether `.ci/run` installs or provides it (then its absence fails under CI=true) */
  ciProvides: boolean;
}

/** inCi says whether the tests run in CI (`CI=true` or `CI=1`). */
export function inCi(env: NodeJS.ProcessEnv = process.env): boolean {
  return env.CI === 'true' || env.CI === '1';
}

/** isCgroup2 says whether p is a cgroup2 mount (statfs f_type CGROUP2_SUPER_MAGIC). */
function isCgroup2(p: string): boolean {
  try {
    return statfsSync(p).type === 0x63677270;
  } catch {
    return false;
  }
}

function which(cmd: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

/** The parts sandnode's integration suites use. */
export const PARTS = {
  root: { name: 'root', present: () => process.getuid?.() === 0, ciProvides: true },
  runc: { name: 'runc (apt-get install runc)', present: () => spawnSync('runc', ['--version'], { stdio: 'ignore' }).status === 0, ciProvides: true },
  busybox: { name: 'busybox-static (apt-get install busybox-static)', present: () => existsSync('/bin/busybox'), ciProvides: true },
  loop: { name: '/dev/loop-control (loop devices: modprobe loop)', present: () => existsSync('/dev/loop-control'), ciProvides: true },
  e2fsprogs: { name: 'e2fsprogs (apt-get install e2fsprogs)', present: () => which('mkfs.ext4'), ciProvides: true },
  fsfreeze: { name: 'fsfreeze (util-linux)', present: () => which('fsfreeze'), ciProvides: true },
  docker: {
    name: 'a Docker engine (apt-get install docker.io; bash deploy/docker-engine.sh)',
    present: () => spawnSync('docker', ['info'], { stdio: 'ignore', timeout: 10_000 }).status === 0,
    ciProvides: true,
  },
  cgroup2: {
    name: 'a cgroup2 mount at /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid)',
    present: () => ['/sys/fs/cgroup', '/sys/fs/cgroup/unified'].some(isCgroup2),
    ciProvides: true,
  },
  ublk: { name: '/dev/ublk-control (ublk_drv; not on this kernel)', present: () => existsSync('/dev/ublk-control'), ciProvides: false },
  firecracker: { name: 'a firecracker binary on PATH', present: () => which('firecracker'), ciProvides: false },
} satisfies Record<string, Part>;

/** built is the part "package `pkg` is built" (its dist/main.js or dist/index.js). */
export function built(pkg: string, file = 'dist/main.js'): Part {
  return {
    name: `${pkg} built (${file}: npm run build)`,
    present: () => {
      try {
        return existsSync(path.join(path.dirname(require.resolve(`${pkg}/package.json`)), file));
      } catch {
        return false;
      }
    },
    ciProvides: true,
  };
}

/** The parts a whole node needs: root, runc, busybox, loop devices, e2fsprogs and every daemon built. */
export const NODE_PARTS: Part[] = [
  PARTS.root,
  PARTS.runc,
  PARTS.busybox,
  PARTS.loop,
  PARTS.e2fsprogs,
  built('@sandnode/vmm-supervisor'),
  built('@sandnode/ublk-manager'),
  built('@sandnode/server'),
  built('@sandnode/podd', 'dist/podd.bundle.js'),
];

/** missing lists the names of the parts this machine lacks. */
export function missing(parts: readonly Part[]): string[] {
  return parts.filter((p) => !p.present()).map((p) => p.name);
}

/**
 * describeWith is `describe(name, fn)` when every part is present. Otherwise: under CI a
 * suite with a missing part that CI provides becomes one failing test naming it; else
 * `describe.skip` with a warning naming what is missing. `extra` adds missing things found
 * by the suite itself (names), which count as CI-provided.
 */
export function describeWith(name: string, parts: readonly Part[], fn: () => void, extra: string[] = []): void {
  const absent = parts.filter((p) => !p.present());
  const names = [...absent.map((p) => p.name), ...extra];
  if (!names.length) {
    describe(name, fn);
    return;
  }
  const ciMust = extra.length > 0 || absent.some((p) => p.ciProvides);
  if (inCi() && ciMust) {
    describe(name, () => {
      it('has its prerequisites (CI=true: a part .ci/run installs must not be missing)', () => {
        throw new Error(`missing under CI=true: ${names.join(', ')}`);
      });
    });
    return;
  }
  // Straight to stderr: jest drops the console output of a file whose tests all skipped (unless --verbose).
  process.stderr.write(`skipping "${name}": missing ${names.join(', ')}\n`);
  describe.skip(name, fn);
}

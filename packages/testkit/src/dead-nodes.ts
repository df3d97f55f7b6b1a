/**
 * Test nodes left by a test run that was killed (kill -9 of jest, a CI timeout, ^C twice): their
 * daemons run on, their sandboxes' containers, loop devices, mounts, netns and nftables table
 * stay, and the machine fills up run after run. Each node fixture writes an owner file in its
 * root (`<tmpdir>/sandnode-it-XXXXXX/owner.json`: the jest process's pid and start ticks, and
 * the network tag); {@link sweepDeadTestNodes}, run by every startNode, stops and purges the
 * nodes whose owner is gone.
 *
 * /tmp is everyone's: a root is swept only when it, its owner file and its state and run dirs
 * are real dirs/files (never symlinks) of this process's uid and not writable by others, so a
 * planted `sandnode-it-x` with `run -> /` is left alone. One sweeper per root (an exclusive lock
 * file), so two jest workers do not purge the same node at once.
 */
import { spawnSync } from 'node:child_process';
import { lstatSync, readdirSync, readFileSync, writeFileSync, type Stats } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { processStartTicks } from '@sandnode/shared';
import { purgeNode, sandnodeProcesses, type StackDirs } from '@sandnode/node-stack';
import { killProcesses } from './kill-processes';

/** The prefix of a test node's root in the temp dir (startNode). */
export const TEST_NODE_PREFIX = 'sandnode-it-';
/** The owner file in a test node's root. */
export const OWNER_FILE = 'owner.json';
const LOCK_FILE = 'sweep.lock';

/** What a test node's owner file holds. */
export interface TestNodeOwner {
  pid: number;
  ticks: number;
  /** the network tag of a networked node (its netns and nftables names), "" without network */
  tag: string;
}

/** writeOwner records that this process owns the test node at root. */
export function writeOwner(root: string, tag = ''): void {
  const owner: TestNodeOwner = { pid: process.pid, ticks: processStartTicks(process.pid) ?? 0, tag };
  writeFileSync(path.join(root, OWNER_FILE), JSON.stringify(owner), { mode: 0o600, flag: 'wx' });
}

/** ours: st is a real dir (or file) of this uid that others cannot write. */
function ours(st: Stats | undefined, dir: boolean): boolean {
  if (!st || st.isSymbolicLink() || (dir ? !st.isDirectory() : !st.isFile())) return false;
  return st.uid === process.getuid?.() && (st.mode & 0o022) === 0;
}

function lstat(p: string): Stats | undefined {
  try {
    return lstatSync(p);
  } catch {
    return undefined;
  }
}

/** readOwner is the owner of root when root is a test node's (see the file header), else undefined. */
export function readOwner(root: string): TestNodeOwner | undefined {
  const file = path.join(root, OWNER_FILE);
  if (!ours(lstat(root), true) || !ours(lstat(file), false)) return undefined;
  try {
    const o = JSON.parse(readFileSync(file, 'utf8')) as Partial<TestNodeOwner>;
    if (!Number.isInteger(o.pid) || !Number.isInteger(o.ticks)) return undefined;
    const tag = typeof o.tag === 'string' && /^[0-9a-z]{0,4}$/.test(o.tag) ? o.tag : '';
    return { pid: o.pid!, ticks: o.ticks!, tag };
  } catch {
    return undefined;
  }
}

/**
 * sweepDeadTestNodes stops and purges every test node in tmp whose owner process is gone: its
 * daemons SIGKILLed, its containers, mounts, loop devices and network removed (purgeNode), its
 * root deleted. Nodes of live owners, roots without a valid owner file and roots that fail the
 * checks of the file header are left alone. Returns the roots swept.
 */
export async function sweepDeadTestNodes(tmp = os.tmpdir()): Promise<string[]> {
  const swept: string[] = [];
  let names: string[];
  try {
    names = readdirSync(tmp).filter((n) => n.startsWith(TEST_NODE_PREFIX));
  } catch {
    return swept;
  }
  for (const name of names) {
    const root = path.join(tmp, name);
    const owner = readOwner(root);
    if (!owner || processStartTicks(owner.pid) === owner.ticks) continue;
    const dirs: StackDirs = {
      stateDir: path.join(root, 'state'),
      runDir: path.join(root, 'run'),
      listen: '',
      network: { enabled: false, ingressListen: '', ...(owner.tag ? { tag: owner.tag } : {}) },
    };
    if (!ours(lstat(dirs.stateDir), true) || !ours(lstat(dirs.runDir), true)) continue;
    try {
      writeFileSync(path.join(root, LOCK_FILE), String(process.pid), { flag: 'wx', mode: 0o600 });
    } catch {
      continue; // another worker sweeps it
    }
    await killProcesses(
      sandnodeProcesses(dirs.runDir).map((p) => p.pid),
      0,
    );
    await purgeNode(dirs).catch(() => undefined);
    // never into a mount the purge could not remove (it is left, and named by rm's error)
    const rm = spawnSync('rm', ['-rf', '--one-file-system', root], { encoding: 'utf8' });
    if (rm.status === 0) swept.push(root);
  }
  return swept;
}

/**
 * Shared parts of the handover integration tests (handover.it.test.ts,
 * handover-churn.it.test.ts): the daemon path, the prerequisite check that skips naming what
 * is missing, and small helpers over sysfs, mountinfo and gRPC codes.
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc';

export const ROOT = path.resolve(__dirname, '..', '..', '..', '..');
export const MAIN = path.join(ROOT, 'services', 'ublk-manager', 'dist', 'main.js');
export const MIB = 1024 * 1024;

function hasCommand(cmd: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

/** missingPrerequisites names what the handover tests need and this host lacks. */
export const missingPrerequisites = [
  ...(process.getuid?.() === 0 ? [] : ['root']),
  ...(existsSync('/dev/loop-control') ? [] : ['/dev/loop-control']),
  ...['losetup', 'blockdev', 'mkfs.ext4', 'mount', 'umount'].filter((c) => !hasCommand(c)),
];

/** handoverSuite is describe, or describe.skip (with a warning naming what is missing). */
export function handoverSuite(what: string): jest.Describe {
  if (missingPrerequisites.length > 0) console.warn(`ublk-manager ${what} integration tests skipped: missing ${missingPrerequisites.join(', ')}`);
  return missingPrerequisites.length === 0 ? describe : describe.skip;
}

export type Slot = 'a' | 'b';
export interface Daemon {
  proc: ChildProcess;
  done: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  pid: number;
}

export function backingOf(dev: string): string | undefined {
  try {
    return readFileSync(`/sys/block/${path.basename(dev)}/loop/backing_file`, 'utf8').trim();
  } catch {
    return undefined;
  }
}

export function loopsUnder(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync('/sys/block').filter((n) => /^loop\d+$/.test(n))) {
    const f = backingOf(`/dev/${name}`)?.replace(/ \(deleted\)$/, '');
    if (f?.startsWith(`${dir}/`)) out.push(`/dev/${name}`);
  }
  return out;
}

export function isMounted(dir: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[4] === dir);
}

export function percentile(sorted: number[], p: number): number {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] ?? NaN;
}

/** expectCode awaits p and asserts a ClientError with code whose details contain text. */
export async function expectCode(p: Promise<unknown>, code: Status, text?: string): Promise<void> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ClientError);
  expect(Status[(err as ClientError).code]).toBe(Status[code]);
  if (text) expect((err as ClientError).details).toContain(text);
}

export function httpGet(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve(body));
      })
      .on('error', reject);
  });
}

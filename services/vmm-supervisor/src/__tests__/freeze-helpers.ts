/**
 * Helpers of the freeze integration tests: host-side writers that block on a frozen
 * filesystem, and a client of a VM's freeze port.
 */
import { spawn } from 'node:child_process';
import { createSandnodeChannel, createServiceClient, type ServiceClient } from '@sandnode/shared';
import { FreezePortServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';

/** BlockedWriter is a host process writing one file; `done` resolves with the wall clock ms it exited at. */
export interface BlockedWriter {
  startedAtMs: number;
  done: Promise<number>;
  /** Whether it has exited. */
  exited(): boolean;
}

/**
 * startWriter spawns `sh -c 'echo x > file'`: on a frozen filesystem open(O_CREAT|O_TRUNC)
 * blocks in sb_start_write until the thaw, so its exit time is when the filesystem thawed
 * (plus process exit latency).
 */
export function startWriter(file: string): BlockedWriter {
  const startedAtMs = Date.now();
  const child = spawn('/bin/sh', ['-c', 'echo x > "$1"', 'writer', file], { stdio: 'ignore' });
  let exitedAt: number | undefined;
  const done = new Promise<number>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => {
      exitedAt = Date.now();
      if (code === 0) resolve(exitedAt);
      else reject(new Error(`writer of ${file} exited ${code}`));
    });
  });
  return { startedAtMs, done, exited: () => exitedAt !== undefined };
}

/** freezePortClient is a client of the freeze port on socketPath (one attempt per call). */
export function freezePortClient(socketPath: string, timeoutMs = 10_000): ServiceClient<typeof FreezePortServiceDefinition> {
  return createServiceClient(FreezePortServiceDefinition, createSandnodeChannel(`unix://${socketPath}`), { timeoutMs, retryAttempts: 1 });
}

/**
 * sleep is only for time that is itself under test (a freeze window left to run, a writer given
 * the chance to finish if it were not blocked); waiting for a condition is testkit's waitFor.
 */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Slack allowed on top of max_freeze_ms for the watchdog's thaw (the contract bound of the tests), ms. */
export const WINDOW_SLACK_MS = 100;

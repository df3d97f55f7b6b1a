/**
 * Network pools of test nodes (docs/network.md; helper notes: unique names and addresses per
 * node, several jest workers and test runs on one machine): each networked test node takes one
 * /24 of 10.211.0.0/17 (index 0..127) by a lock file, and with it a tag and host ports of its
 * own, so that no two live test nodes share an interface name, nftables table, address or port.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { processStartTicks } from '@sandnode/shared';
import type { NodeNetworkSettings } from '@sandnode/node-stack';

/** Pools a machine's test nodes share: /24s of 10.211.0.0/17. */
export const TEST_POOLS = 128;
/** First host port of the test nodes' resolvers (+ index); proxies at +200, ingress at +400. */
export const TEST_PORT_BASE = 16_000;

/** A held test pool: the node's network settings and the release of its lock. */
export interface TestPool {
  index: number;
  settings: NodeNetworkSettings;
  /** release removes the lock (idempotent) */
  release(): void;
}

/** The dir of the pool locks (one file per index, holding "PID START_TICKS"). */
export function poolLockDir(): string {
  return path.join(os.tmpdir(), 'sandnode-test-pools');
}

/** holder says whether a lock's "PID START_TICKS" names a live process. */
function held(text: string): boolean {
  const [pid, ticks] = text.trim().split(' ').map(Number);
  return !!pid && processStartTicks(pid) !== undefined && processStartTicks(pid) === ticks;
}

/**
 * takeTestPool takes the first free index (a lock of a dead process is taken over) and gives
 * its settings: pool 10.211.i.0/24, tag "t<hex i>", dns/proxy/ingress ports of its own.
 * Throws when all TEST_POOLS are held.
 */
export function takeTestPool(): TestPool {
  const dir = poolLockDir();
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const me = `${process.pid} ${processStartTicks(process.pid) ?? ''}\n`;
  for (let i = 0; i < TEST_POOLS; i++) {
    const file = path.join(dir, `${i}.lock`);
    try {
      writeFileSync(file, me, { flag: 'wx', mode: 0o600 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      let text: string;
      try {
        text = readFileSync(file, 'utf8');
      } catch {
        continue; // released meanwhile: the next round may take it
      }
      if (held(text)) continue;
      rmSync(file, { force: true });
      try {
        writeFileSync(file, me, { flag: 'wx', mode: 0o600 });
      } catch {
        continue; // another process took it over first
      }
    }
    let released = false;
    return {
      index: i,
      settings: {
        enabled: true,
        pool: `10.211.${i}.0/24`,
        tag: `t${i.toString(16).padStart(2, '0')}`,
        dnsPort: TEST_PORT_BASE + i,
        egressProxyPort: TEST_PORT_BASE + 200 + i,
        ingressListen: `127.0.0.1:${TEST_PORT_BASE + 400 + i}`,
      },
      release() {
        if (released) return;
        released = true;
        rmSync(file, { force: true });
      },
    };
  }
  throw new Error(`all ${TEST_POOLS} test network pools are held (locks in ${dir})`);
}

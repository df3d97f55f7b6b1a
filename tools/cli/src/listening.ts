/**
 * What a daemon opened for others to connect to, as the kernel shows it (for `sandnode up`'s
 * OPENS column), and which listeners the server could not open (a port taken by another
 * process), from its log. Read from /proc: the process's socket fds matched by inode against
 * its network namespace's tables (/proc/<pid>/net/{unix,tcp,tcp6,udp,udp6}), so what is shown
 * is what listens, not what a config file asks for.
 */
import { closeSync, existsSync, lstatSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { daemonLogFile, linePid, openLog, readAllLines } from './log-files';

/** The socket inodes among pid's open fds (empty when /proc cannot be read). */
export function socketInodes(pid: number): Set<string> {
  const out = new Set<string>();
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return out;
  }
  for (const fd of fds) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) out.add(m[1]!);
    } catch {
      /* closed meanwhile */
    }
  }
  return out;
}

/** An IPv4 or IPv6 address:port from /proc/net/tcp's hex form ("0100007F:2124"). */
export function procAddress(hex: string): string {
  const [addr = '', port = '0'] = hex.split(':');
  const p = parseInt(port, 16);
  if (addr.length === 8) {
    const b = Buffer.from(addr, 'hex');
    return `${b[3]}.${b[2]}.${b[1]}.${b[0]}:${p}`;
  }
  // IPv6: four 32-bit words, each in host (little-endian) order
  const words = (addr.match(/.{8}/g) ?? []).map((w) => Buffer.from(w, 'hex').reverse().toString('hex'));
  const groups = words.join('').match(/.{4}/g) ?? [];
  const text = groups.map((g) => g.replace(/^0+(?=.)/, '')).join(':');
  return `[${text.replace(/(^|:)0(:0)+(:|$)/, '::')}]:${p}`;
}

/**
 * unixPathNow is the name a listening unix socket has now. The kernel keeps the path it was
 * bound to; the server binds `<path>.<pid>.tmp` and then links it to `<path>` and removes the
 * temporary name (handover/listeners.ts), so a bound path of that form that is gone while
 * `<path>` is a socket is shown as `<path>`. Any other path is returned as it is.
 */
export function unixPathNow(bound: string): string {
  const m = /^(.+)\.\d+\.tmp$/.exec(bound);
  if (!m || existsSync(bound)) return bound;
  return lstatSync(m[1]!, { throwIfNoEntry: false })?.isSocket() ? m[1]! : bound;
}

/**
 * listeningSockets lists what pid listens on, sorted: "unix /path" (listening stream sockets
 * with a path, by the name they have now: unixPathNow), "tcp host:port" (LISTEN), "udp host:port" (bound). Empty when /proc cannot be read.
 */
export function listeningSockets(pid: number): string[] {
  const inodes = socketInodes(pid);
  if (inodes.size === 0) return [];
  const out = new Set<string>();
  const read = (name: string) => {
    try {
      return readFileSync(`/proc/${pid}/net/${name}`, 'utf8').split('\n').slice(1);
    } catch {
      return [];
    }
  };
  // unix: Num RefCount Protocol Flags Type St Inode Path; flags 00010000 = __SO_ACCEPTCON (listening)
  for (const line of read('unix')) {
    const f = line.trim().split(/\s+/);
    if (f.length >= 8 && inodes.has(f[6]!) && (parseInt(f[3]!, 16) & 0x10000) !== 0) out.add(`unix ${unixPathNow(f.slice(7).join(' '))}`);
  }
  for (const [file, proto, wanted] of [
    ['tcp', 'tcp', '0A'],
    ['tcp6', 'tcp', '0A'],
    ['udp', 'udp', '07'],
    ['udp6', 'udp', '07'],
  ] as const) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    for (const line of read(file)) {
      const f = line.trim().split(/\s+/);
      if (f.length >= 10 && f[3] === wanted && inodes.has(f[9]!)) out.add(`${proto} ${procAddress(f[1]!)}`);
    }
  }
  return [...out].sort();
}

/** The socket each VM's freeze port listens on, below its VM dir (vmm-supervisor drivers/runc.ts). */
const PER_SANDBOX_SOCKET = /^unix (.*)\/[^/]+\/freeze-port\/freeze\.sock$/;

/**
 * nodeOpens is what `up` shows a daemon opens for the node: listeningSockets less the sockets
 * made for one sandbox each (vmm-supervisor's freeze port of every VM, warm pool members too),
 * which are counted in one entry "unix <vms>/<id>/freeze-port/freeze.sock (one per sandbox: N)"
 * rather than listed (before: a node with a pool of 20 printed 20 paths in the OPENS column).
 */
export function nodeOpens(opens: readonly string[]): string[] {
  const perSandbox = new Map<string, number>();
  const out: string[] = [];
  for (const o of opens) {
    const m = PER_SANDBOX_SOCKET.exec(o);
    if (m) perSandbox.set(m[1]!, (perSandbox.get(m[1]!) ?? 0) + 1);
    else out.push(o);
  }
  for (const [dir, n] of perSandbox) out.push(`unix ${dir}/<id>/freeze-port/freeze.sock (one per sandbox: ${n})`);
  return out;
}

/** A listener the server could not open (its log line "could not open a named listener"). */
export interface ListenerFailure {
  /** "ingress", "egress-proxy", "dns", … */
  listener: string;
  address: string;
  /** the error's code (EADDRINUSE, EACCES, …) or message */
  error: string;
}

/** The message the server logs for a named listener it could not open (handover/server-node.ts). */
export const LISTENER_FAILURE_MSG = 'could not open a named listener: it is off on this server';

/** pidLines are the log lines of pid in its stderr file (another pid's, of an earlier daemon in the same file, are left out). */
function pidLines(pid: number, logFile: string | undefined): string[] {
  let log;
  try {
    log = logFile ? openLog(logFile) : undefined;
  } catch {
    return [];
  }
  if (!log) return [];
  try {
    return readAllLines(log).filter((l) => linePid(l) === pid);
  } finally {
    closeSync(log.fd);
  }
}

/** failuresIn picks the listener failures out of a server's log lines. */
export function failuresIn(lines: readonly string[]): ListenerFailure[] {
  const out: ListenerFailure[] = [];
  for (const line of lines) {
    if (!line.includes(LISTENER_FAILURE_MSG)) continue;
    try {
      const j = JSON.parse(line) as { listener?: string; address?: string; err?: { code?: string; message?: string } };
      out.push({ listener: String(j.listener ?? '?'), address: String(j.address ?? '?'), error: j.err?.code ?? j.err?.message ?? 'unknown error' });
    } catch {
      /* not JSON */
    }
  }
  return out;
}

/**
 * listenerFailures reads the server pid's log (the file its stderr goes to) for the listeners it
 * could not open at its activation: it waits (at most waitMs) for the server's "active" line,
 * which follows them.
 */
export async function listenerFailures(pid: number, waitMs = 1500, logFile = daemonLogFile(pid)): Promise<ListenerFailure[]> {
  const until = Date.now() + waitMs;
  for (;;) {
    const lines = pidLines(pid, logFile);
    if (Date.now() >= until || lines.some((l) => l.includes('"msg":"active"'))) return failuresIn(lines);
    await sleep(100);
  }
}

/**
 * commandOf is how a holder is named: its command line (arguments joined, cut to 120 characters)
 * rather than its comm, which for every Node 24 process is the thread name "MainThread"
 * (newcomer: the ingress holder was named "pid 16155 (MainThread)"); its comm when the command
 * line cannot be read; "" when neither.
 */
export function commandOf(pid: number): string {
  try {
    const args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    const text = args.join(' ');
    if (text) return text.length > 120 ? `${text.slice(0, 120)}...` : text;
  } catch {
    /* gone, or not ours to read */
  }
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '';
  }
}

/** holderOf names the process (pid and command) that listens on TCP port of address ("host:port"), or "" when none is found. */
export function holderOf(address: string): string {
  const port = Number(/:(\d+)$/.exec(address)?.[1]);
  if (!port) return '';
  const listening = new Set<string>();
  for (const file of ['tcp', 'tcp6']) {
    try {
      for (const line of readFileSync(`/proc/net/${file}`, 'utf8').split('\n').slice(1)) {
        const f = line.trim().split(/\s+/);
        if (f.length >= 10 && f[3] === '0A' && parseInt(f[1]!.split(':')[1]!, 16) === port) listening.add(f[9]!);
      }
    } catch {
      /* no such table */
    }
  }
  if (listening.size === 0) return '';
  for (const p of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    const pid = Number(p);
    for (const ino of socketInodes(pid)) {
      if (!listening.has(ino)) continue;
      return `pid ${pid}${((c) => (c ? ` (${c})` : ''))(commandOf(pid))}`;
    }
  }
  return '';
}

/**
 * The host side of a pod instance: the dirs of its volumes (the emptyDir made a shared mount so
 * that Bidirectional propagation works), and, after the run, everything the pod left on the
 * host: mounts propagated out of the containers, loop devices backed by its state dir, the dirs.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { planPodHost, type PodHost, type PodLayout } from './pod-layout';

/** Output of a command run by sh(). */
export interface ShResult {
  status: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/**
 * sh runs a host command without blocking the event loop. Never throws: a missing binary is
 * status 127, a kill at timeoutMs (default 300 s) status 128 with the signal in stderr. cwd: the
 * working dir (default this process's).
 */
export function sh(cmd: string, args: string[], opts: { input?: string; timeoutMs?: number; cwd?: string } = {}): Promise<ShResult> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    let child;
    try {
      child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], cwd: opts.cwd });
    } catch (err) {
      resolve({ status: 127, stdout: '', stderr: (err as Error).message, ms: 0 });
      return;
    }
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', (err) => (stderr += err.message));
    child.stdin.on('error', () => undefined); // the command may exit before reading its input (EPIPE)
    child.stdin.end(opts.input ?? '');
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 300_000);
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      resolve({ status: code ?? (sig ? 128 : 127), stdout, stderr: sig ? `${stderr}\n(killed by ${sig})` : stderr, ms: Date.now() - t0 });
    });
  });
}

/** The server's TCP TLS Secret of deploy/k8s (keys ca.crt, tls.crt, tls.key). */
const API_TLS_SECRET = 'sandnode-api-tls';

/** makeApiTls fills dir with a throwaway CA (ca.crt) and a server pair it signs (tls.crt, tls.key), as the operator's Secret would hold; openssl. */
async function makeApiTls(dir: string): Promise<void> {
  mkdirSync(dir, { recursive: true });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  const steps: string[][] = [
    ['req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=sandnode compat CA'],
    ['req', '-new', ...ec, '-keyout', 'tls.key', '-out', 'tls.csr', '-subj', '/CN=localhost'],
    ['x509', '-req', '-in', 'tls.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'tls.crt', '-days', '2'],
  ];
  for (const args of steps) {
    const r = await sh('openssl', args, { cwd: dir });
    if (r.status !== 0) throw new Error(`openssl ${args[0]} for the TLS Secret failed: ${r.stderr.trim()}`);
  }
  for (const f of ['ca.key', 'tls.csr', 'ca.srl']) rmSync(path.join(dir, f), { force: true });
}

/**
 * preparePodHost makes the host dirs of the pod's volumes below a new dir of workDir: the
 * ConfigMap's files, the remapped hostPath dirs, the emptyDir as its own shared mount (rshared
 * and rslave binds need a shared source). Throws when a mount fails.
 */
export async function preparePodHost(layout: PodLayout, workDir: string): Promise<PodHost> {
  const runId = randomBytes(3).toString('hex');
  const host = planPodHost(layout, mkdtempSync(path.join(workDir, `pod-${runId}-`)), runId);
  mkdirSync(host.configDir, { recursive: true });
  for (const [f, text] of Object.entries(layout.configFiles)) writeFileSync(path.join(host.configDir, f), text);
  for (const d of Object.values(host.remapped)) mkdirSync(d, { recursive: true });
  for (const [name, d] of Object.entries(host.secretDirs)) {
    if (name !== API_TLS_SECRET) throw new Error(`Secret ${name}: only ${API_TLS_SECRET} is made by the container mode`);
    await makeApiTls(d);
  }
  for (const d of host.emptyDirs) {
    mkdirSync(d, { recursive: true });
    let r = await sh('mount', ['--bind', d, d]);
    if (r.status === 0) r = await sh('mount', ['--make-shared', d]);
    if (r.status !== 0) throw new Error(`cannot make ${d} a shared mount: ${r.stderr.trim()}`);
  }
  return host;
}

/** mountsBelow lists mount points at or below root, deepest first. */
function mountsBelow(root: string): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const mp = line.split(' ')[4]?.replace(/\\040/g, ' ');
    if (mp && (mp === root || mp.startsWith(`${root}/`))) out.push(mp);
  }
  return out.sort((a, b) => b.length - a.length);
}

/** inodesBelow lists the inodes of the regular files below root on device dev (to find our loop devices). */
function inodesBelow(root: string, dev: number): Set<number> {
  const out = new Set<number>();
  const walk = (p: string) => {
    let st;
    try {
      st = lstatSync(p);
    } catch {
      return;
    }
    if (st.dev !== dev) return;
    if (st.isFile()) out.add(st.ino);
    else if (st.isDirectory()) for (const e of readdirSync(p)) walk(path.join(p, e));
  };
  walk(root);
  return out;
}

/**
 * cleanupPodHost removes what a pod left on the host: loop devices backed by a file of its
 * remapped state dir (matched by device and inode: the backing path the kernel shows is the
 * container's) or by a device image of one of sandboxIds, the mounts below its root (sandbox
 * mounts propagated out, then the shared bind), then the dirs. The containers must be gone
 * already. Returns notes for the report; never throws.
 */
export async function cleanupPodHost(host: PodHost, sandboxIds: string[] = []): Promise<string[]> {
  const notes: string[] = [];
  const rootDev = statSync(host.root).dev;
  const inodes = inodesBelow(host.root, rootDev);
  const major = Math.floor(rootDev / 256);
  const minor = rootDev % 256;
  const loops = await sh('losetup', ['-l', '-J', '-O', 'NAME,BACK-FILE,BACK-INO,BACK-MAJ:MIN']);
  try {
    const list = (JSON.parse(loops.stdout || '{"loopdevices":[]}') as { loopdevices: { name: string; 'back-file': string; 'back-ino': string | number; 'back-maj:min': string }[] }).loopdevices;
    for (const l of list) {
      const [ma, mi] = String(l['back-maj:min']).split(':').map(Number);
      // a device image of a sandbox of this run (its file may be deleted already: match by name)
      const ours = sandboxIds.some((id) => new RegExp(`/images/${id}-[a-z]+\\.img( \\(deleted\\))?$`).test(l['back-file'] ?? ''));
      if (ours || (ma === major && mi === minor && inodes.has(Number(l['back-ino'])))) {
        const r = await sh('losetup', ['-d', l.name]);
        notes.push(`detached ${l.name}${r.status ? ` (failed: ${r.stderr.trim()})` : ''}`);
      }
    }
  } catch (err) {
    notes.push(`losetup -l: ${(err as Error).message}`);
  }
  for (let pass = 0; pass < 3; pass++) {
    const ms = mountsBelow(host.root);
    if (!ms.length) break;
    for (const m of ms) {
      const r = await sh('umount', [m]);
      if (r.status !== 0) await sh('umount', ['-l', m]);
    }
    if (pass === 0) notes.push(`unmounted ${ms.length} mount(s) below ${host.root}`);
  }
  try {
    rmSync(host.root, { recursive: true, force: true });
  } catch (err) {
    notes.push(`rm ${host.root}: ${(err as Error).message}`);
  }
  return notes;
}

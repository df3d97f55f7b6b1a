/**
 * The node's stable identity (issue 15 §3): one `node_id` per node, the same in every component,
 * unchanged across upgrades, restarts, pod replacement and drain/resume. It is what a multi-node
 * layer routes by, so it is never derived from anything that changes with the process (pid, pod
 * name, boot id).
 *
 * Where it comes from, first match wins:
 * 1. `SANDNODE_NODE_ID` (on Kubernetes: the node's name from the downward API, `spec.nodeName`;
 *    never the pod name, which changes on every pod replacement). When it differs from the file
 *    below, the file is rewritten: the operator chose a new identity.
 * 2. `<stateDir>/node-id`, made once and kept.
 * 3. A new id `node-<16 hex digits>`, written to `<stateDir>/node-id` so that every component that
 *    starts at the same moment ends up with the same one (created with link(2): exactly one
 *    writer wins, the others read the winner's).
 */
import { randomBytes } from 'node:crypto';
import { constants, closeSync, fstatSync, fsyncSync, linkSync, mkdirSync, openSync, readSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';

/** NODE_ID_ENV is the environment variable that sets the node id. */
export const NODE_ID_ENV = 'SANDNODE_NODE_ID';
/** NODE_ID_FILE is the file name, in the node's state dir, of the kept node id. */
export const NODE_ID_FILE = 'node-id';
/** NODE_ID_MAX_BYTES is the longest node id: a Kubernetes node name (a DNS subdomain) is at most 253. */
export const NODE_ID_MAX_BYTES = 253;

const VALID = /^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/;

/** nodeIdProblem says why s is not a node id (lower-case DNS subdomain characters, 1..253 bytes), or undefined when it is one. */
export function nodeIdProblem(s: string): string | undefined {
  if (s.length === 0) return 'it is empty';
  if (s.length > NODE_ID_MAX_BYTES) return `it is ${s.length} bytes long (at most ${NODE_ID_MAX_BYTES})`;
  if (!VALID.test(s)) return 'only a-z, 0-9, "." and "-" are allowed, starting and ending with a letter or digit';
  return undefined;
}

/**
 * resolveNodeId returns this node's id, making and keeping one in `<stateDir>/node-id` when
 * there is none. `env` defaults to process.env.
 *
 * Throws an Error naming the variable or the file when the configured value or the kept file
 * is not a node id (a component then refuses to start: an identity is never silently replaced).
 */
export function resolveNodeId(stateDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const file = path.join(stateDir, NODE_ID_FILE);
  const configured = env[NODE_ID_ENV]?.trim();
  if (configured) {
    const problem = nodeIdProblem(configured);
    if (problem) throw new Error(`${NODE_ID_ENV}=${JSON.stringify(configured.slice(0, 64))} is not a node id: ${problem}`);
    if (readKept(file) !== configured) writeReplacing(file, configured);
    return configured;
  }
  const kept = readKept(file);
  if (kept !== undefined) return kept;
  mkdirSync(stateDir, { recursive: true });
  return claimNodeId(file, `node-${randomBytes(8).toString('hex')}`);
}

/**
 * claimNodeId writes candidate to file unless file exists already (another component won the
 * race between its read and this write), and returns the id the file holds: candidate, or the
 * winner's. The temp file it links from is always removed.
 */
export function claimNodeId(file: string, candidate: string): string {
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileDurably(tmp, candidate);
  try {
    linkSync(tmp, file); // link(2) never replaces: exactly one of the components starting together wins
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    unlinkSync(tmp);
  }
  const won = readKept(file);
  if (won === undefined) throw new Error(`${file} vanished while it was being made`);
  return won;
}

/**
 * keptNodeId is the id kept in `<stateDir>/node-id`, read only (nothing is made): undefined when
 * there is none or it is not a node id. For readers that are not components (`sandnode status`
 * with every component down).
 */
export function keptNodeId(stateDir: string): string | undefined {
  try {
    return readKept(path.join(stateDir, NODE_ID_FILE));
  } catch {
    return undefined;
  }
}

/** readKept reads the kept id (undefined when the file does not exist); throws naming the file when its content is not a node id or it is not a regular file. */
function readKept(file: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return undefined;
    if (code === 'ELOOP') throw new Error(`${file} is a symlink; the node id file must be a regular file`, { cause: err });
    throw err;
  }
  try {
    if (!fstatSync(fd).isFile()) throw new Error(`${file} is not a regular file; the node id file must be one`);
    const buf = Buffer.alloc(NODE_ID_MAX_BYTES + 2);
    const n = readSync(fd, buf, 0, buf.length, 0);
    const text = buf.subarray(0, n).toString('utf8').trim();
    const problem = nodeIdProblem(text);
    if (problem) throw new Error(`${file} does not hold a node id (${problem}); fix or remove it, or set ${NODE_ID_ENV}`);
    return text;
  } finally {
    closeSync(fd);
  }
}

function writeFileDurably(file: string, id: string): void {
  const fd = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o644);
  try {
    writeSync(fd, `${id}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function writeReplacing(file: string, id: string): void {
  mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileDurably(tmp, id);
  renameSync(tmp, file);
}

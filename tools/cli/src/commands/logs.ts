/**
 * `sandnode logs [COMPONENT] [-f] [--since WHEN] [-n N]`: the daemons' logs, read from the file
 * each RUNNING daemon writes (its stderr, found in /proc: `up` starts them on
 * `<runDir>/logs/<component>.log`, `upgrade server` on `logs/server-<slot>.log`). `-f` follows
 * the file as it grows and, when another process takes the component over (an upgrade, a
 * restart), switches to the file that one writes, first printing its lines since it started.
 *
 * `sandnode sandbox logs ID [-f] [--tail N]`: a sandbox's console (the stdout and stderr of its
 * init, captured by the runc driver under `<runDir>/vm-tmpfs/<id>/console/console.log`, capped
 * at `consoleLogBytes`; VMs of a 0.2.0 supervisor: `<runDir>/vms/<id>/console.log`). The
 * console is written by the sandbox: it is opened without following symlinks, and on a
 * terminal its control characters are shown escaped.
 *
 * Both work only on the node itself (they read its files; not with --address).
 */
import { closeSync, fstatSync } from 'node:fs';
import path from 'node:path';
import { InvalidArgumentError, type Command } from 'commander';
import { COMPONENTS, findActiveServer, findRunning, getVersion, logFile, type Component } from '@sandnode/node-stack';
import { requireLocal } from '../local-only';
import { dirsOf, wholeNumber, type CliDirs } from '../options';
import { CliError, action } from '../output';
import { LineSplitter, SWITCH_SCAN_BYTES, daemonLogFile, lastLines, linePid, openLog, parseSince, readAllLines, readNew, safeForTerminal, sinceFilter, type OpenLog } from '../log-files';
import { safeLine } from '../terminal-safe';

/** How often a followed file is read for new lines, ms. */
export const FOLLOW_POLL_MS = 250;
/** How often `logs -f` asks which process runs each component (and which file it writes), ms. */
export const FOLLOW_RESOLVE_MS = 1000;

/** Where a component's log is read from now. */
export interface LogSource {
  component: Component;
  /** the log file */
  path: string;
  /** the pid of the process that writes it, when one runs */
  pid?: number;
  /** said on stderr when the file is not one a running process writes */
  note?: string;
}

/** currentPid: the pid of the process that serves c now (the server: the lease holder), undefined when none runs. */
async function currentPid(d: CliDirs, c: Component): Promise<number | undefined> {
  if (c === 'server') {
    const active = await findActiveServer(d.runDir).catch(() => undefined);
    if (active?.holderPid) return active.holderPid;
  } else {
    const v = await getVersion(d, c);
    if (v?.pid) return v.pid;
  }
  return findRunning(d, c)?.pid;
}

/** logSource: the file c's running process writes, else the file `up` makes for it (with a note saying so). */
export async function logSource(d: CliDirs, c: Component): Promise<LogSource> {
  const pid = await currentPid(d, c);
  const file = pid ? daemonLogFile(pid) : undefined;
  if (pid && file) return { component: c, path: file, pid };
  const fallback = logFile(d, c);
  return {
    component: c,
    path: fallback,
    note: pid
      ? `${c} (pid ${pid}) does not write its log to a file (its stderr is a pipe or terminal, e.g. under Kubernetes: kubectl logs); showing ${fallback}`
      : `${c} is not running: showing its last log file ${fallback}`,
  };
}

/** componentArg checks the COMPONENT argument (usage error, exit 2, for another name). */
function componentArg(v: string): Component {
  if (!(COMPONENTS as readonly string[]).includes(v)) throw new InvalidArgumentError(`expected one of ${COMPONENTS.join(', ')}`);
  return v as Component;
}

/** sandboxIdArg checks a sandbox id ("sb-" + 16 hex digits): it names a dir on the host. */
function sandboxIdArg(v: string): string {
  if (!/^sb-[0-9a-f]{16}$/.test(v)) throw new InvalidArgumentError('expected a sandbox id (sb- and 16 hex digits)');
  return v;
}

/** Options of both logs commands. */
interface LogsOpts {
  follow?: boolean;
  since?: number;
  tail?: number;
}

/** out writes lines to stdout, each with prefix; control characters escaped on a terminal. */
function out(lines: string[], prefix = ''): void {
  if (!lines.length) return;
  const text = lines.map((l) => `${prefix}${l}\n`).join('');
  process.stdout.write(process.stdout.isTTY ? safeForTerminal(text) : text);
}

/** note writes a line about the logs (not of them) to stderr. */
function note(line: string): void {
  process.stderr.write(safeLine(`sandnode: logs: ${line}`));
}

/** One followed file. */
interface Followed {
  src: LogSource;
  log: OpenLog | undefined;
  split: LineSplitter;
  keep: (line: string) => boolean;
  prefix: string;
}

/** printExisting prints what f's file holds now (--since, --tail) and leaves its position at the end. */
function printExisting(f: Followed, tail: number | undefined): void {
  if (!f.log) return;
  out(lastLines(readAllLines(f.log).filter(f.keep), tail), f.prefix);
}

/** drainNew prints the whole lines f's file gained since it was last read. */
function drainNew(f: Followed): void {
  if (!f.log) return;
  for (let t = readNew(f.log); t; t = readNew(f.log)) out(f.split.push(t).filter(f.keep), f.prefix);
}

/** switchTo makes f follow src: the old file's last lines first, then src's lines of its process (the end of the file), then what it gains. */
function switchTo(f: Followed, src: LogSource): void {
  drainNew(f);
  out(f.split.flush().filter(f.keep), f.prefix);
  if (f.log) closeLog(f.log);
  f.src = src;
  f.log = openLog(src.path);
  note(`${src.component} is now pid ${src.pid ?? '-'}, writing ${src.path}: following that file`);
  if (!f.log || src.pid === undefined) return;
  const pid = src.pid;
  f.log.pos = Math.max(0, fileSize(f.log) - SWITCH_SCAN_BYTES);
  const lines = readAllLines(f.log);
  // the scan may start inside a line: only lines of the new process are printed, whole ones
  out(lines.filter((l) => linePid(l) === pid).filter(f.keep), f.prefix);
}

/** fileSize of an open log. */
function fileSize(log: OpenLog): number {
  return fstatSync(log.fd).size;
}

/** closeLog closes an open log's fd (errors ignored: it is only read). */
function closeLog(log: OpenLog): void {
  try {
    closeSync(log.fd);
  } catch {
    // nothing to do
  }
}

/** follow prints what the files gain until the process is stopped (Ctrl-C); resolve (may be undefined) says which file each should be now. */
async function follow(files: Followed[], resolve: ((f: Followed) => Promise<LogSource>) | undefined): Promise<never> {
  const stop = () => process.exit(0);
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  let lastResolve = Date.now();
  for (;;) {
    for (const f of files) {
      if (!f.log) f.log = openLog(f.src.path); // not there yet: it may be made
      drainNew(f);
    }
    if (resolve && Date.now() - lastResolve >= FOLLOW_RESOLVE_MS) {
      lastResolve = Date.now();
      for (const f of files) {
        const now = await resolve(f).catch(() => undefined);
        if (now?.pid === undefined || now.pid === f.src.pid) continue;
        if (now.path !== f.src.path) switchTo(f, now);
        else f.src = now; // the same file, another process (restarted by up): its lines come as the file grows
      }
    }
    await new Promise((r) => setTimeout(r, FOLLOW_POLL_MS));
  }
}

/** registerLogsCommands adds `logs` to program and `logs` to the sandbox group. */
export function registerLogsCommands(program: Command, sandbox: Command): void {
  program
    .command('logs')
    .description("print the daemons' logs (pino JSON lines) from the file each running daemon writes; -f follows it, also across `upgrade server` (the new server writes another file)")
    .argument('[component]', `one of ${COMPONENTS.join(', ')} (default: all, each line prefixed with its component)`, componentArg)
    .option('-f, --follow', 'keep printing lines as they are written (Ctrl-C ends)')
    .option('--since <when>', 'only lines from then on: a duration back from now (30s, 10m, 2h, 1d) or an ISO 8601 time', (v: string) => parseSince(v))
    .option('-n, --tail <lines>', 'only the last N lines of each log (then new ones with -f)', wholeNumber)
    .action(
      action(async (component: Component | undefined, o: LogsOpts, cmd: Command) => {
        requireLocal(cmd, 'logs');
        const d = dirsOf(cmd);
        const which = component ? [component] : [...COMPONENTS];
        const width = Math.max(...which.map((c) => c.length));
        const files: Followed[] = [];
        for (const c of which) {
          const src = await logSource(d, c);
          if (src.note) note(src.note);
          const log = openLog(src.path);
          if (!log) note(`${src.path} does not exist (no ${c} was started on this run dir${o.follow ? '; waiting for it' : ''})`);
          files.push({ src, log, split: new LineSplitter(), keep: sinceFilter(o.since), prefix: component ? '' : `${c.padEnd(width)} | ` });
        }
        for (const f of files) printExisting(f, o.tail);
        if (o.follow) await follow(files, (f) => logSource(d, f.src.component));
        for (const f of files) if (f.log) closeLog(f.log);
      }),
    );

  sandbox
    .command('logs')
    .description("print a sandbox's console: the stdout and stderr of its init as the node captured them (capped; a DRAINED sandbox has none until it runs again)")
    .argument('<id>', 'sandbox id', sandboxIdArg)
    .option('-f, --follow', 'keep printing what it writes (Ctrl-C ends)')
    .option('-n, --tail <lines>', 'only the last N lines', wholeNumber)
    .action(
      action(async (id: string, o: LogsOpts, cmd: Command) => {
        requireLocal(cmd, 'sandbox logs');
        const d = dirsOf(cmd);
        const candidates = consolePaths(d.runDir, id);
        let found: { path: string; log: OpenLog } | undefined;
        for (const p of candidates) {
          const log = openLog(p);
          if (log) {
            found = { path: p, log };
            break;
          }
        }
        if (!found) {
          throw new CliError(
            `no console of ${id} on this node (looked at ${candidates.join(' and ')}): it is not running here (a DRAINED sandbox has no console until \`sandnode sandbox resume\`; check \`sandnode sandbox get ${id}\`), or its vmm-supervisor lacks "vmm.console-cap.v1" and keeps no console; what a command printed is in \`sandnode sandbox exec\`'s output, and \`sandnode sandbox ps ${id}\` lists the commands`,
          );
        }
        const f: Followed = { src: { component: 'vmm-supervisor', path: found.path }, log: found.log, split: new LineSplitter(), keep: () => true, prefix: '' };
        printExisting(f, o.tail);
        if (o.follow) await follow([f], undefined);
        closeLog(found.log);
      }),
    );
}

/** consolePaths are where a sandbox's console may be, newest layout first (runc driver of 0.3.0: the console tmpfs; 0.2.0: the VM dir). */
export function consolePaths(runDir: string, id: string): string[] {
  const r = path.resolve(runDir);
  return [path.join(r, 'vm-tmpfs', id, 'console', 'console.log'), path.join(r, 'vms', id, 'console.log')];
}

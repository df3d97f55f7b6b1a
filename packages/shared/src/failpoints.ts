/**
 * Failpoints: named places where a test makes a process fail on purpose (after containerd's
 * `integration/failpoint`). Each service has its own env var, `SANDNODE_<SERVICE>_FAILPOINTS`
 * (e.g. `SANDNODE_SERVER_FAILPOINTS`), holding a comma-separated list of `name=action`; a
 * bare `name` means the service's default action. Actions:
 *
 * - `kill`: the process sends itself SIGKILL at that place (a crash at exactly that step);
 * - `error`: the call throws InternalError("failpoint <name>") there;
 * - `pause`: (only where the service allows it) the call waits there until SIGUSR2;
 * - `hang`: (only where the service allows it) the call never ends (a stuck handler);
 * - `off`: nothing.
 *
 * Unknown names or actions are an error at start naming them. Unset in production: every
 * check is one map lookup.
 */
import { InternalError } from './errors';
import { envKey } from './config';

/** What a failpoint does. */
export type FailpointAction = 'kill' | 'error' | 'pause' | 'hang' | 'off';
const ACTIONS: readonly FailpointAction[] = ['kill', 'error', 'pause', 'hang', 'off'];

/** failpointsEnv("server") -> "SANDNODE_SERVER_FAILPOINTS". */
export function failpointsEnv(service: string): string {
  return envKey(service, 'failpoints');
}

export interface FailpointsSpec<N extends string> {
  /** the service name used in the env var, e.g. "ublk-manager" */
  service: string;
  /** every failpoint name this service has */
  names: readonly N[];
  /** action of a bare name (default `kill`) */
  defaultAction?: FailpointAction;
  /** names that accept `pause` / `hang` (default none) */
  pausable?: readonly N[];
  hangable?: readonly N[];
}

/** One service's failpoints: parse once at start (`set`), check at each named place. */
export class Failpoints<N extends string> {
  private active = new Map<N, FailpointAction>();

  constructor(private readonly spec: FailpointsSpec<N>) {}

  /** env is the service's env var name. */
  get env(): string {
    return failpointsEnv(this.spec.service);
  }

  /** parse reads a `name=action,...` list; throws Error naming a bad entry. */
  parse(list: string | undefined): Map<N, FailpointAction> {
    const out = new Map<N, FailpointAction>();
    for (const part of (list ?? '')
      .split(',')
      .map((p) => p.trim())
      .filter(Boolean)) {
      const eq = part.lastIndexOf('=');
      const name = eq < 0 ? part : part.slice(0, eq);
      const action = eq < 0 ? (this.spec.defaultAction ?? 'kill') : part.slice(eq + 1);
      if (!(this.spec.names as readonly string[]).includes(name)) {
        throw new Error(`${this.env}: unknown failpoint "${name}" (known: ${this.spec.names.join(', ')})`);
      }
      if (!(ACTIONS as readonly string[]).includes(action)) {
        throw new Error(`${this.env}: failpoint "${name}": unknown action "${action}" (${ACTIONS.join(', ')})`);
      }
      if (action === 'pause' && !(this.spec.pausable ?? []).includes(name as N)) {
        throw new Error(`${this.env}: failpoint "${name}": pause is only for ${(this.spec.pausable ?? []).join(', ') || 'none'}`);
      }
      if (action === 'hang' && !(this.spec.hangable ?? []).includes(name as N)) {
        throw new Error(`${this.env}: failpoint "${name}": hang is only for ${(this.spec.hangable ?? []).join(', ') || 'none'}`);
      }
      out.set(name as N, action as FailpointAction);
    }
    return out;
  }

  /** set replaces the active failpoints from list (default: the service's env var). */
  set(list: string | undefined = process.env[this.env]): void {
    this.active = this.parse(list);
  }

  /** list names the active ones as `name=action` (for the start log). */
  list(): string[] {
    return [...this.active].filter(([, a]) => a !== 'off').map(([n, a]) => `${n}=${a}`);
  }

  /** enabled says whether name has an action other than `off`. */
  enabled(name: N): boolean {
    const a = this.active.get(name);
    return a !== undefined && a !== 'off';
  }

  /** hit runs the `kill` / `error` action set for name, if any (pause/hang need {@link hitAsync}). */
  hit(name: N): void {
    const action = this.active.get(name);
    if (action === 'error') throw new InternalError(`failpoint ${name}`);
    if (action === 'kill') {
      process.kill(process.pid, 'SIGKILL');
      // SIGKILL to ourselves is delivered before the syscall returns; never reached.
      throw new InternalError(`failpoint ${name}: SIGKILL did not stop the process`);
    }
  }

  /** hitAsync runs any action set for name; `pause` waits for SIGUSR2 (onPause first), `hang` never settles. */
  async hitAsync(name: N, onPause?: () => void): Promise<void> {
    const action = this.active.get(name);
    if (action === 'hang') return new Promise<never>(() => undefined);
    if (action !== 'pause') return this.hit(name);
    const resumed = new Promise<void>((resolve) => process.once('SIGUSR2', () => resolve()));
    onPause?.();
    await resumed;
  }
}

/**
 * The SandboxService side of idle actions (core/idle.ts): every handler that names a sandbox
 * counts as its activity while it runs (an Exec stream until it ends, each event too), and the
 * handlers that need a RUNNING sandbox (Exec, the file calls, and any later guest call: every
 * method not in LIFECYCLE) first auto-resume a PAUSED or hibernated one. One wrapper around the
 * whole implementation, driven by the service definition, so a new RPC is covered without a hook
 * of its own. Client-streaming methods carry no sandbox id in their first argument and are passed
 * through as they are (ExecStream and UploadFile call idleStream / idleCall themselves).
 *
 * A read-role caller (ctx.callerRole, set by authMiddleware) is neither activity nor a call in
 * flight and never auto-resumes: its call on a PAUSED or hibernated sandbox is FAILED_PRECONDITION
 * (IdleController.refuseAsleep), so a read-only observer can neither keep a sandbox running nor
 * wake it at its owner's cost. Admin callers, and every caller of a server without an AuthPolicy,
 * keep the behaviour above.
 */
import type { Role, SandnodeCallContext } from '@sandnode/shared';
import type { CallContext } from 'nice-grpc-common';
import { SandboxServiceDefinition, type SandboxServiceImplementation } from '@sandnode/shared/proto/server/v1/sandbox';
import type { IdleController } from '../core/idle';

/** Methods that move or look at the record themselves: no auto-resume. */
const LIFECYCLE = new Set([
  'createSandbox',
  'getSandbox',
  'listSandboxes',
  'pauseSandbox',
  'resumeSandbox',
  'deleteSandbox',
  'setTimeout',
  'forkSandbox',
  'resetRootfs',
  'updateSandboxNetwork',
  'keepAlive',
]);
/** Methods that are no activity of the sandbox they name (looking at it, or ending its use; KeepAlive is a lease of its own). */
const NOT_ACTIVITY = new Set(['getSandbox', 'listSandboxes', 'pauseSandbox', 'deleteSandbox', 'keepAlive']);

type Ctx = CallContext & SandnodeCallContext;
type Handler = (req: unknown, ctx: Ctx) => unknown;

/** sandboxOf is the sandbox a request names (sandbox_id, or a fork's parent_id); "" none. */
function sandboxOf(req: unknown): string {
  const r = req as { sandboxId?: unknown; parentId?: unknown } | null;
  if (typeof r?.sandboxId === 'string') return r.sandboxId;
  if (typeof r?.parentId === 'string') return r.parentId;
  return '';
}

/** withIdle wraps impl's handlers with activity and auto-resume (file header); errors are those of IdleController.ensureRunning and the handler's. */
export function withIdle(impl: SandboxServiceImplementation<SandnodeCallContext>, idle: IdleController): SandboxServiceImplementation<SandnodeCallContext> {
  const out: Record<string, Handler> = { ...(impl as unknown as Record<string, Handler>) };
  for (const [name, def] of Object.entries(SandboxServiceDefinition.methods)) {
    const orig = out[name];
    if (!orig || def.requestStream || NOT_ACTIVITY.has(name)) continue;
    const resume = !LIFECYCLE.has(name);
    const op = def.name;
    if (def.responseStream) {
      out[name] = async function* (req: unknown, ctx: Ctx) {
        const id = sandboxOf(req);
        if (!id) return yield* orig(req, ctx) as AsyncIterable<unknown>;
        yield* idleStream(idle, id, resume ? op : undefined, ctx, () => orig(req, ctx) as AsyncIterable<unknown>);
      };
    } else {
      out[name] = async (req: unknown, ctx: Ctx) => {
        const id = sandboxOf(req);
        if (!id) return orig(req, ctx);
        return idleCall(idle, id, resume ? op : undefined, ctx, async () => orig(req, ctx));
      };
    }
  }
  return out as unknown as SandboxServiceImplementation<SandnodeCallContext>;
}

/** The part of a call's context the idle hooks read: its signal (bounds an auto-resume wait) and the caller's role. */
export interface IdleCaller {
  signal?: AbortSignal;
  callerRole?: Role;
}

/**
 * idleCall runs fn as a call of sandbox id for idle actions (core/idle.ts): in flight (no idle
 * action runs meanwhile) and activity; with op set, a PAUSED or hibernated sandbox is
 * auto-resumed first. A read-role caller gets none of it: with op set, a PAUSED or hibernated
 * sandbox is FAILED_PRECONDITION, then fn runs. Errors: IdleController.ensureRunning's (or
 * refuseAsleep's), then fn's. For handlers that find the id themselves (a client stream names it
 * in its first message).
 */
export async function idleCall<T>(idle: IdleController, id: string, op: string | undefined, caller: IdleCaller, fn: () => Promise<T>): Promise<T> {
  if (caller.callerRole === 'read') {
    if (op) await idle.refuseAsleep(id, op);
    return fn();
  }
  const leave = idle.enter(id);
  try {
    if (op) await idle.ensureRunning(id, op, caller.signal);
    return await fn();
  } finally {
    leave();
  }
}

/** idleStream is idleCall for a stream of events: each event is activity too (not a read-role caller's). */
export async function* idleStream<T>(idle: IdleController, id: string, op: string | undefined, caller: IdleCaller, events: () => AsyncIterable<T>): AsyncIterable<T> {
  if (caller.callerRole === 'read') {
    if (op) await idle.refuseAsleep(id, op);
    return yield* events();
  }
  const leave = idle.enter(id);
  try {
    if (op) await idle.ensureRunning(id, op, caller.signal);
    for await (const ev of events()) {
      idle.activity(id);
      yield ev;
    }
  } finally {
    leave();
  }
}

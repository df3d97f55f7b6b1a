/**
 * pino JSON logs. Every component logs through one root logger with `component` and `version`
 * bound; levels are written as strings (`"level":"info"`). Lines logged while a gRPC call is
 * handled (createServiceServer runs each handler inside {@link runWithLogContext}) also carry
 * the call's `rpc`, `epoch` and `sandbox_id`, whichever logger (root or child) writes them.
 * Logs go to stderr so a component's stdout stays free.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import pino from 'pino';
import type { Logger } from 'pino';

export type { Logger };

/** Log levels accepted in config. */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The fields a handled call adds to each line: rpc path, the component's epoch, the sandbox the call is about. */
export interface LogContext {
  rpc?: string;
  epoch?: number;
  sandbox_id?: string;
}

const logContext = new AsyncLocalStorage<LogContext>();

/** runWithLogContext runs fn (and everything it starts) with ctx's fields on every log line. */
export function runWithLogContext<T>(ctx: LogContext, fn: () => T): T {
  return logContext.run(ctx, fn);
}

/** currentLogContext is the context of the running call (undefined outside one). */
export function currentLogContext(): LogContext | undefined {
  return logContext.getStore();
}

/** pino mixin: the call's fields that neither the line nor the logger's bindings already carry. */
function mixin(obj: object, _level: number, logger: Logger): Record<string, unknown> {
  const ctx = logContext.getStore();
  if (!ctx) return {};
  const bound = logger.bindings();
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(ctx)) if (v !== undefined && v !== '' && !(k in obj) && !(k in bound)) out[k] = v;
  return out;
}

/** createLogger makes the root logger of a component, writing JSON lines to fd 2 (dest: elsewhere, for tests). */
export function createLogger(component: string, version: string, level: LogLevel = 'info', dest?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { component, version, pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      mixin,
    },
    dest ?? pino.destination({ fd: 2, sync: true }),
  );
}

/**
 * pino JSON logs. Every component logs through one root logger with `component` and `version`
 * bound; request handlers use child loggers with `rpc`, `sandbox_id` and (later) `epoch`.
 * Logs go to stderr so a component's stdout stays free.
 */
import pino from 'pino';
import type { Logger } from 'pino';

export type { Logger };

/** Log levels accepted in config. */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** createLogger makes the root logger of a component, writing JSON lines to fd 2. */
export function createLogger(component: string, version: string, level: LogLevel = 'info'): Logger {
  return pino({ level, base: { component, version, pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime }, pino.destination({ fd: 2, sync: true }));
}

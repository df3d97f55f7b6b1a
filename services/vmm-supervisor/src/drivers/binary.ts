/** Locating a driver binary configured by name or path. */
import { accessSync, constants, statSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '@sandnode/shared';

/**
 * resolveExecutable returns the absolute path of an executable: a name without "/" is looked
 * up in PATH, a path is resolved. Throws ConfigError naming configKey when there is none.
 */
export function resolveExecutable(nameOrPath: string, configKey: string, envPath = process.env.PATH ?? ''): string {
  const candidates = nameOrPath.includes('/')
    ? [path.resolve(nameOrPath)]
    : envPath
        .split(':')
        .filter(Boolean)
        .map((d) => path.join(d, nameOrPath));
  for (const c of candidates) {
    try {
      if (!statSync(c).isFile()) continue;
      accessSync(c, constants.X_OK);
      return c;
    } catch {
      /* next */
    }
  }
  const where = nameOrPath.includes('/') ? 'is not an executable file' : 'was not found in PATH';
  throw new ConfigError(`key "${configKey}": ${JSON.stringify(nameOrPath)} ${where}`);
}

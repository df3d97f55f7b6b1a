/**
 * Component identity for `sandnode.common.v1.VersionService/GetVersion`: name, semver, git
 * commit, feature strings and the runtime (Node version) it runs on. Callers check features, never version numbers.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { GetVersionResponse, VersionServiceImplementation } from './gen/sandnode/common/v1/version';

/** ComponentInfo is what a component says about itself. */
export interface ComponentInfo {
  component: string;
  version: string;
  commit: string;
  features: string[];
  /** The node's stable id (see node-id.ts); undefined for podd, which answers "". */
  nodeId?: string;
}

/**
 * Build-time constants that a bundler may define (podd is bundled with esbuild into one file
 * that is copied into templates, where no package.json is beside it).
 */
declare const __SANDNODE_VERSION__: string | undefined;
declare const __SANDNODE_COMMIT__: string | undefined;

/** SUITE_VERSION is the suite's semver: bundled-in, or read from this build's package.json. */
export const SUITE_VERSION: string = readSuiteVersion();

function readSuiteVersion(): string {
  if (typeof __SANDNODE_VERSION__ === 'string') return __SANDNODE_VERSION__;
  try {
    const pkg = JSON.parse(readFileSync(path.join(__dirname, '..', 'package.json'), 'utf8')) as { version?: string };
    return pkg.version ?? '0.0.0';
  } catch {
    return '0.0.0';
  }
}

let cachedCommit: string | undefined;

/**
 * buildCommit is the git commit this build came from: `SANDNODE_BUILD_COMMIT` if set, else
 * `git rev-parse HEAD` in the build's directory, else "unknown".
 */
export function buildCommit(): string {
  if (cachedCommit !== undefined) return cachedCommit;
  if (typeof __SANDNODE_COMMIT__ === 'string') return (cachedCommit = __SANDNODE_COMMIT__);
  cachedCommit = process.env.SANDNODE_BUILD_COMMIT ?? '';
  if (!cachedCommit) {
    try {
      cachedCommit = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: __dirname, stdio: ['ignore', 'pipe', 'ignore'], timeout: 2000 })
        .toString()
        .trim();
    } catch {
      cachedCommit = 'unknown';
    }
  }
  return cachedCommit;
}

const startedAtMs = Date.now();

/** runtimeName is what this process runs on, as GetVersion's `runtime` says it: "node 24.22.3". */
export function runtimeName(): string {
  return `node ${process.versions.node}`;
}

/** versionResponse builds the GetVersion answer for info. */
export function versionResponse(info: ComponentInfo): GetVersionResponse {
  return {
    component: info.component,
    version: info.version,
    commit: info.commit,
    features: [...info.features],
    pid: process.pid,
    startedAtMs,
    runtime: runtimeName(),
    nodeId: info.nodeId ?? '',
  };
}

/** versionService implements VersionService for info. */
export function versionService(info: ComponentInfo): VersionServiceImplementation {
  return { getVersion: async () => versionResponse(info) };
}

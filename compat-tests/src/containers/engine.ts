/**
 * The container engine the container mode runs on: testcontainers' client (the reaper off),
 * and what keeps the mode from running on this machine.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { getContainerRuntimeClient, type ContainerRuntimeClient } from 'testcontainers';
import { REPO_ROOT } from '../releases';

/**
 * runtime is testcontainers' engine client. Its reaper (ryuk) is never used: the ryuk image
 * cannot be pulled here, so TESTCONTAINERS_RYUK_DISABLED=true is set when unset, every
 * container is created with autoCleanup off, and the run removes its containers by label.
 */
export function runtime(): Promise<ContainerRuntimeClient> {
  process.env.TESTCONTAINERS_RYUK_DISABLED ??= 'true';
  return getContainerRuntimeClient();
}

/** The engine as the prerequisite is named (what to install, how to start it). */
export const ENGINE_PART = 'a Docker engine (apt-get install docker.io; bash deploy/docker-engine.sh)';

function engineAnswers(env: NodeJS.ProcessEnv): boolean {
  return spawnSync('docker', ['info', '--format', '{{.ServerVersion}}'], { stdio: 'ignore', timeout: 15_000, env }).status === 0;
}

/**
 * engineMissing says why no engine can run containers here (undefined when one answers
 * `docker info`). When none answers it runs `deploy/docker-engine.sh` once (starts dockerd
 * when installed, waits up to 30 s). Synchronous: test files call it while registering tests.
 * env is the environment the commands run in (its PATH finds `docker`).
 */
export function engineMissing(log: (l: string) => void = () => undefined, env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (spawnSync('docker', ['version'], { stdio: 'ignore', timeout: 10_000, env }).error) return `${ENGINE_PART}: no \`docker\` CLI on PATH`;
  if (engineAnswers(env)) return undefined;
  const script = path.join(REPO_ROOT, 'deploy', 'docker-engine.sh');
  if (!existsSync(script)) return `${ENGINE_PART}: docker info fails and deploy/docker-engine.sh is missing`;
  const r = spawnSync('bash', [script], { encoding: 'utf8', timeout: 45_000, env });
  log((r.stdout ?? '').trim());
  if (engineAnswers(env)) return undefined;
  // the script's own verdict (its last "docker-engine:" line), not the dockerd log tail it prints
  const said = `${r.stdout ?? ''}${r.stderr ?? ''}`.split('\n').filter((l) => l.startsWith('docker-engine:'));
  return `${ENGINE_PART}: not reachable and could not be started (${said.at(-1) ?? r.error?.message ?? `deploy/docker-engine.sh exit ${r.status}`})`;
}

/** containerModeMissing lists what this machine lacks for the container mode: the engine, root. */
export function containerModeMissing(log: (l: string) => void = () => undefined, env: NodeJS.ProcessEnv = process.env): string[] {
  const out: string[] = [];
  const engine = engineMissing(log, env);
  if (engine) out.push(engine);
  if (process.getuid?.() !== 0) out.push('root (privileged containers, shared mounts, loop devices)');
  return out;
}

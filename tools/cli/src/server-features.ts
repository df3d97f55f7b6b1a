/**
 * Request fields an older server does not know are dropped without a word (proto3 unknown
 * fields): a 0.2.0 server given `sandbox create --pause-after-s 60` makes a sandbox that is
 * never paused, given `--env` one whose commands lack the variables. Before such a call the CLI
 * asks the server's features (GetVersion) and refuses, changing nothing, when a flag the user
 * gave needs one the server lacks.
 */
import { ClientError, Status } from 'nice-grpc-common';
import type { ServerApi } from '@sandnode/node-stack';
import { CliError } from './output';

/** One thing the user asked for and the server feature it needs. */
export interface FeatureNeed {
  /** the server feature ("server.idle.v1") */
  feature: string;
  /** what needs it, as the user said it ("--pause-after-s") */
  what: string;
}

/**
 * requireServerFeatures resolves when the server of api lists every feature of needs (at once
 * when there is none). Errors: a CliError with FAILED_PRECONDITION (kept in --json) naming the
 * server's version, each missing feature and the flags that need it; GetVersion's own.
 */
export async function requireServerFeatures(api: ServerApi, needs: FeatureNeed[]): Promise<void> {
  if (needs.length === 0) return;
  const v = await api.version.getVersion({});
  const missing = needs.filter((n) => !v.features.includes(n.feature));
  if (missing.length === 0) return;
  const byFeature = new Map<string, string[]>();
  for (const m of missing) byFeature.set(m.feature, [...(byFeature.get(m.feature) ?? []), m.what]);
  const parts = [...byFeature].map(([f, what]) => `"${f}" (for ${what.join(', ')})`);
  const msg = `the server (${v.version || 'an unknown version'}) lacks ${parts.join(' and ')}: it would ignore ${missing.length > 1 ? 'them' : 'it'}; nothing was done. Upgrade the server (sandnode upgrade server) or leave ${missing.length > 1 ? 'these flags' : 'the flag'} out`;
  throw new CliError(msg, { cause: new ClientError('/sandnode.common.v1.VersionService/GetVersion', Status.FAILED_PRECONDITION, msg) });
}

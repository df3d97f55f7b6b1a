/**
 * `sandnode image build [--build-dir DIR] [--tag REF | --repo NAME] [--modules runtime|all]
 * [--force] [--json]`: the node's OCI image (issue 15 §3) from local parts only, tagged with
 * the release version of the build's package.json (`sandnode:<version>`), through a local
 * Docker engine (`docker import`; no registry, no base image). What the image holds:
 * @sandnode/node-stack image.ts. An image whose inputs are unchanged is reused (`--force`
 * rebuilds). Exit 1 naming the cause when the build is not built or no engine answers.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { buildNodeImage, nodeFor, nodeImageTag, type ImageModules } from '@sandnode/node-stack';
import { action, print } from '../output';
import { safeLine } from '../terminal-safe';

/** The checkout this CLI belongs to (tools/cli/dist/commands -> the repository root). */
const OWN_BUILD = path.resolve(__dirname, '..', '..', '..', '..');

/** commitOf is the git commit of dir (`git rev-parse HEAD`), "" when it is no git checkout. */
function commitOf(dir: string): string {
  try {
    return execFileSync('git', ['rev-parse', 'HEAD'], { cwd: dir, stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 })
      .toString()
      .trim();
  } catch {
    return '';
  }
}

/** registerImageCommands adds `image build` to program. */
export function registerImageCommands(program: Command): void {
  program
    .command('image')
    .description("the node's container image")
    .command('build')
    .description("build the node image from this machine's parts into the local Docker engine, tagged sandnode:<release version>")
    .option('--build-dir <dir>', 'the built checkout to package (default: the one this CLI runs from)', OWN_BUILD)
    .option('--tag <ref>', 'image reference (default: <repo>:<version of package.json>)')
    .option('--repo <name>', 'repository part of the default tag', 'sandnode')
    .addOption(new Option('--modules <which>', 'node_modules in the image: the runtime closure from package-lock.json, or all of it').choices(['runtime', 'all']).default('runtime'))
    .option('--force', 'rebuild even when an image of the same inputs exists')
    .option('--json', 'print JSON')
    .action(
      action(async (o: { buildDir: string; tag?: string; repo: string; modules: ImageModules; force?: boolean; json?: boolean }) => {
        const dir = path.resolve(o.buildDir);
        for (const f of ['tools/cli/dist/main.js', 'services/server/dist/main.js', 'services/podd/dist/podd.bundle.js'])
          if (!existsSync(path.join(dir, f))) throw new Error(`${dir} is not built (no ${f}): run npm run build there first`);
        const version = (JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8')) as { version: string }).version;
        const tag = o.tag ?? nodeImageTag(dir, o.repo);
        const r = await buildNodeImage({
          buildDir: dir,
          tag,
          node: nodeFor(dir),
          commit: commitOf(dir),
          version,
          modules: o.modules,
          force: !!o.force,
          log: o.json ? undefined : (l) => process.stderr.write(safeLine(l)),
        });
        print(!!o.json, r, () =>
          [
            `${r.image} ${r.built ? 'built' : 'up to date'}: ${r.id.slice(0, 19)}, ${(r.sizeBytes / 1e6).toFixed(1)} MB, ${r.ms} ms`,
            ...(r.missingTools.length ? [`left out (not on this host): ${r.missingTools.join(', ')}`] : []),
          ].join('\n'),
        );
      }),
    );
}

/**
 * `sandnode template build [NAME] [--replace] | template list`: the node's templates.
 */
import type { Command } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { table } from '@sandnode/node-stack';
import { dirsOf } from '../options';
import { CliError, action, print } from '../output';
import { withServer } from '../server-calls';

/** Bytes per MiB, for the sizes the tables show. */
const MIB = 1024 * 1024;
/** The template `template build` builds when given no name. */
export const DEFAULT_TEMPLATE = 'base';

/** registerTemplateCommands adds `template build` and `template list` to program. */
export function registerTemplateCommands(program: Command): void {
  const template = program.command('template').description('build and list templates');

  template
    .command('build [name]')
    .description('build a template from busybox-static, the Node runtime and podd (no network)')
    .option('--replace', 'rebuild an existing template (refused while a sandbox uses it)')
    .option('--json', 'print JSON')
    .action(
      action(async (name: string | undefined, o: { replace?: boolean; json?: boolean }, cmd: Command) => {
        const n = name ?? DEFAULT_TEMPLATE;
        await withServer(dirsOf(cmd), async (api) => {
          try {
            const t = (await api.templates.buildTemplate({ name: n, replace: !!o.replace })).template!;
            print(!!o.json, t, () => `built template ${t.name} (podd ${t.poddVersion}, ${(t.sizeBytes / MIB).toFixed(1)} MiB) in ${t.buildMs} ms at ${t.rootfsPath}`);
          } catch (err) {
            if (err instanceof ClientError && err.code === Status.ALREADY_EXISTS && !o.replace) throw new CliError(`template ${n} exists (use --replace to rebuild)`, { cause: err });
            throw err;
          }
        });
      }),
    );

  template
    .command('list')
    .option('--json', 'print JSON')
    .action(
      action(async (o: { json?: boolean }, cmd: Command) => {
        const r = await withServer(dirsOf(cmd), (api) => api.templates.listTemplates({}));
        print(!!o.json, r.templates, () =>
          table(
            ['NAME', 'PODD', 'SIZE MIB', 'CREATED'],
            r.templates.map((t) => [t.name, t.poddVersion, (t.sizeBytes / MIB).toFixed(1), new Date(t.createdAtMs).toISOString()]),
          ),
        );
      }),
    );
}

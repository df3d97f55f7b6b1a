/**
 * `sandnode template build [NAME] [--replace] | template list | template delete NAME [--if-exists]`:
 * the node's templates.
 */
import type { Command } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { table } from '@sandnode/node-stack';
import { SERVER_FEATURES } from '@sandnode/shared';
import { ListTemplatesResponse } from '@sandnode/shared/proto/server/v1/template';
import { dirsOf } from '../options';
import { CliError, action, print } from '../output';
import { addOutputOptions, render, type OutputOpts } from '../output-format';
import { withServer } from '../server-calls';
import { withProgress } from '../terminal';

/** Bytes per MiB, for the sizes the tables show. */
const MIB = 1024 * 1024;
/** The template `template build` builds when given no name. */
export const DEFAULT_TEMPLATE = 'base';

/**
 * deleteRefusal turns a DeleteTemplate error into words: UNIMPLEMENTED (a server older than
 * 0.3.0) names the feature and the version needed; NOT_FOUND with ifExists is no error
 * (undefined); anything else passes unchanged. The gRPC code stays in --json (CliError cause).
 */
export function deleteRefusal(err: unknown, name: string, ifExists: boolean): unknown {
  if (!(err instanceof ClientError)) return err;
  if (err.code === Status.UNIMPLEMENTED) {
    return new CliError(`the server cannot delete templates: it lacks feature "${SERVER_FEATURES.templateDelete}" (sandnode 0.3.0 or newer); upgrade it (sandnode upgrade server)`, { cause: err });
  }
  if (err.code === Status.NOT_FOUND && ifExists) return undefined;
  if (err.code === Status.NOT_FOUND) return new CliError(`template ${name} does not exist (--if-exists: no error then)`, { cause: err });
  return err;
}

/** registerTemplateCommands adds `template build`, `template list` and `template delete` to program. */
export function registerTemplateCommands(program: Command): void {
  const template = program.command('template').description('build, list and delete templates');

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
            const t = (await withProgress(`building template ${n}`, !!o.json, () => api.templates.buildTemplate({ name: n, replace: !!o.replace }))).template!;
            print(!!o.json, t, () => `built template ${t.name} (podd ${t.poddVersion}, ${(t.sizeBytes / MIB).toFixed(1)} MiB) in ${t.buildMs} ms at ${t.rootfsPath}`);
          } catch (err) {
            if (err instanceof ClientError && err.code === Status.ALREADY_EXISTS && !o.replace) throw new CliError(`template ${n} exists (use --replace to rebuild)`, { cause: err });
            throw err;
          }
        });
      }),
    );

  addOutputOptions(template.command('list').description('list the templates (name, podd, size, creation time; -o wide: build time and rootfs path)')).action(
    action(async (o: OutputOpts, cmd: Command) => {
      const r = await withServer(dirsOf(cmd), (api) => api.templates.listTemplates({}));
      const row = (t: (typeof r.templates)[number]) => [t.name, t.poddVersion, (t.sizeBytes / MIB).toFixed(1), new Date(t.createdAtMs).toISOString()];
      render(o, {
        json: r.templates,
        proto: () => ListTemplatesResponse.toJSON(r),
        human: () => table(['NAME', 'PODD', 'SIZE MIB', 'CREATED'], r.templates.map(row)),
        wide: () =>
          table(
            ['NAME', 'PODD', 'SIZE MIB', 'CREATED', 'BUILD MS', 'ROOTFS'],
            r.templates.map((t) => [...row(t), t.buildMs, t.rootfsPath]),
          ),
      });
    }),
  );

  template
    .command('delete <name>')
    .description('delete a template (its rootfs and manifest); refused while a sandbox uses it; needs a server with "server.template-delete.v1"')
    .option('--if-exists', 'a template that does not exist is no error')
    .option('--json', 'print JSON: {deleted: NAME|null, template: {...}|null}')
    .action(
      action(async (name: string, o: { ifExists?: boolean; json?: boolean }, cmd: Command) => {
        const t = await withServer(dirsOf(cmd), async (api) => {
          try {
            return (await api.templates.deleteTemplate({ name })).template;
          } catch (err) {
            const e = deleteRefusal(err, name, !!o.ifExists);
            if (e === undefined) return undefined;
            throw e;
          }
        });
        print(!!o.json, { deleted: t ? name : null, template: t ?? null }, () => (t ? `template ${name} deleted (${(t.sizeBytes / MIB).toFixed(1)} MiB freed)` : `template ${name} did not exist`));
      }),
    );
}

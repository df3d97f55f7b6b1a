#!/usr/bin/env node
/**
 * sandnode: the operator CLI of a node. Tables for people, `--json` for scripts.
 *
 *   sandnode up | down [--purge] | status [--json] | version [--json]
 *   sandnode logs [COMPONENT] [-f] [--since WHEN] [-n N]
 *   sandnode template build [NAME] [--replace] | template list [-o json|yaml|wide] | template delete NAME [--if-exists]
 *   sandnode sandbox create --template base [--json] | list | get ID | exec ID -- CMD... |
 *                    pause ID | resume ID | fork ID | reset-rootfs ID | delete ID... [--if-exists] |
 *                    set-timeout ID SECONDS | cp SRC DST | ls ID [PATH] | stat ID PATH | ps ID | logs ID [-f]
 *
 * Read commands take `-o json|yaml|wide` (json: the proto JSON mapping of the response) beside
 * `--json` (the CLI's own fields, unchanged for scripts); output-format.ts.
 *   sandnode upgrade server | ublk-manager (--from-build DIR | --standby)
 *   sandnode drain [--deadline-ms MS] [--concurrency N]
 *   sandnode certs init [--dir D] [--force]
 *   sandnode image build [--build-dir DIR] [--tag REF] [--modules runtime|all] [--force]
 *   sandnode token create --name N [--role admin|read] [--ttl-ms MS] | token list | token revoke NAME|ID
 *   sandnode demo
 *
 * Exit codes (output.ts): 0 ok; 1 failure (the gRPC status is printed); 2 usage error;
 * `sandbox exec` exits with the command's exit code.
 *
 * This file only composes the program: each command group is a file under commands/.
 */
import { Command } from 'commander';
import { registerCertsCommands } from './commands/certs';
import { registerDemoCommand } from './commands/demo';
import { registerDrainCommand } from './commands/drain';
import { registerLogsCommands } from './commands/logs';
import { registerNodeCommands } from './commands/node';
import { registerPoolCommands } from './commands/pool';
import { registerSandboxCommands } from './commands/sandbox';
import { registerImageCommands } from './commands/image';
import { registerExecCommand } from './commands/sandbox-exec';
import { registerFileCommands } from './commands/sandbox-file-commands';
import { registerTemplateCommands } from './commands/template';
import { registerTokenCommands } from './commands/token';
import { registerUpgradeCommands } from './commands/upgrade';
import { registerVersionCommand } from './commands/version';
import { addGlobalOptions } from './options';
import { describeError, formatError } from './output';
import { installUsageErrors } from './usage';
import { quietIpServername } from './warnings';

quietIpServername();

const program = addGlobalOptions(new Command('sandnode').description('Operate a sandnode node: its daemons, templates and sandboxes'));
registerNodeCommands(program);
registerVersionCommand(program);
registerTemplateCommands(program);
const sandboxGroup = registerSandboxCommands(program);
registerExecCommand(sandboxGroup);
registerFileCommands(sandboxGroup);
registerLogsCommands(program, sandboxGroup);
registerUpgradeCommands(program);
registerDrainCommand(program);
registerTokenCommands(program);
registerPoolCommands(program);
registerCertsCommands(program);
registerImageCommands(program);
registerDemoCommand(program);
installUsageErrors(program);

program.parseAsync(process.argv).catch((err: unknown) => {
  const r = describeError(err);
  process.stderr.write(formatError(r, false));
  process.exit(r.exitCode);
});

/**
 * What `sandnode sandbox resume` needs running on the node: a drain stops the ublk-manager (the
 * drained sandboxes' disks stay as images that it attaches again when it starts), and a node
 * shutdown stops every daemon; resuming a drained sandbox needs all three components. Starting
 * them here means no `sandnode up` is needed between `drain` and `resume` (issue 11, issue 15).
 */
import { COMPONENTS, findRunning, type Component, type StackDirs } from './components';
import { startStack, type StartedComponent, type StartOptions, type StackOps } from './stack';

/** missingComponents lists the components whose pid file names no live process, in start order. */
export function missingComponents(dirs: StackDirs): Component[] {
  return COMPONENTS.filter((c) => !findRunning(dirs, c));
}

/**
 * startWhatResumeNeeds starts the components a resume needs that are not running (none: [],
 * nothing probed), through startStack: a component that fails to start undoes what this call
 * started and throws Error naming it (and its log). Returns the components this call started.
 */
export async function startWhatResumeNeeds(dirs: StackDirs, opts: StartOptions = {}, ops?: StackOps): Promise<StartedComponent[]> {
  if (missingComponents(dirs).length === 0) return [];
  return (await startStack(dirs, opts, ops)).filter((c) => c.started);
}

/** Resolves when one of `work` settles, or after `ms` (the timer is cleared; a rejection is the caller's to catch beforehand). */
export async function waitAtMost(work: Promise<unknown> | Promise<unknown>[], ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([...(Array.isArray(work) ? work : [work]), new Promise<void>((done) => (timer = setTimeout(done, ms)))]);
  clearTimeout(timer);
}

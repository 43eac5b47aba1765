// Makes the system Abseil's synchronisation primitives visible to ThreadSanitizer.
//
// Why: samplerd links Debian's libabsl (//third_party:absl), built without -fsanitize=thread. An
// absl::Mutex is an atomic word that the uninstrumented library sets and clears, so TSan sees no
// happens-before edge between one thread's Unlock and the next thread's Lock, and reports every
// access guarded by an absl::Mutex as a data race (Abseil annotates its Mutex for TSan only when
// Abseil itself is built with TSan). Building Abseil from source is not possible offline (CI may
// use Debian's apt and PyPI only), so under --config=tsan this file, linked into every binary
// (tools/sanitizers/BUILD, through //third_party:absl), interposes on the library's entry points:
// each definition below is found before the library's by the dynamic linker, tells TSan about the
// edge (__tsan_acquire / __tsan_release on the object's address) and calls the library's own
// function (dlsym(RTLD_NEXT)).
//
// What TSan then knows: Unlock (and a wait's implicit unlock) releases, Lock (and every way of
// getting the mutex back: TryLock, LockWhen, the end of Await or CondVar::Wait) acquires, and so
// does each evaluation of a Condition, on whichever thread the library runs it; the
// same for Notification (Notify releases, the waits and HasBeenNotified's atomic load acquire)
// and BlockingCounter. What it does not know: which thread holds which mutex, so TSan's lock-order
// (deadlock) reports and "unlock of an unlocked mutex" do not cover absl::Mutex; a reader lock is
// treated as a writer's (two readers appear ordered, which can only hide a race, never invent
// one). Races on data that no absl primitive guards are reported as usual.
//
// Only built with --config=tsan (the select() in tools/sanitizers/BUILD); not with
// --config=tsan_deps, whose Abseil is built with -fsanitize=thread (build_tsan_deps.sh) and
// annotates its own Mutex.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}

namespace {

#define SAMPLERD_STRINGIFY_INNER(x) #x
#define SAMPLERD_STRINGIFY(x) SAMPLERD_STRINGIFY_INNER(x)

// The library's definition of the function whose mangled name, after "absl::<inline ns>::", is
// `suffix` (e.g. "5Mutex4LockEv"; a const member function's name starts "_ZNK"). Aborts if the
// library has no such symbol: a different Abseil than the one this file was written against (Debian
// 12's 20220623) must be looked at again.
void* Real(const char* suffix, bool is_const) {
  const char* ns = SAMPLERD_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  std::string name = std::string(is_const ? "_ZNK" : "_ZN") + "4absl" +
                     std::to_string(std::strlen(ns)) + ns + suffix;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in the Abseil library\n", name.c_str());
    std::abort();
  }
  return fn;
}

template <typename Fn>
Fn RealFn(const char* suffix, bool is_const = false) {
  return reinterpret_cast<Fn>(Real(suffix, is_const));
}

// A Condition is evaluated with the mutex held, by the waiting thread or by whichever thread
// is unlocking (inside the library, after that thread's release annotation): so each evaluation
// is made an acquire and a release of its own. The waiter passes Guarded(cond, mu) instead of
// `cond`; it lives on the waiter's stack for the whole call, as the caller's Condition does.
// The waiter wrote that GuardedEval (and the caller's Condition) before the library handed it to
// the unlocking thread, a handoff TSan cannot see: the waiter releases on the GuardedEval's address
// once it is written, and each evaluation acquires it before reading it (without that edge, the
// evaluation's first read was reported as a race with the waiter's write, about one run in 40 of
// //server:work_pool_test under --config=tsan).
struct GuardedEval {
  const absl::Condition* cond;
  absl::Mutex* mu;
};
// Takes void*: a Condition made from a void* function is called through the library's own
// (uninstrumented) Condition::CallVoidPtrFunction; the typed constructor's caller is a template
// instantiated here, whose read of the Condition's fields would come before this acquire.
bool EvalGuarded(void* arg) {
  auto* guarded = static_cast<GuardedEval*>(arg);
  __tsan_acquire(guarded);
  __tsan_acquire(guarded->mu);
  const bool met = guarded->cond->Eval();
  __tsan_release(guarded->mu);
  return met;
}

}  // namespace

#define SAMPLERD_GUARDED(cond)                                                    \
  GuardedEval guarded_eval{&(cond), this};                                        \
  const absl::Condition guarded(&EvalGuarded, static_cast<void*>(&guarded_eval)); \
  __tsan_release(&guarded_eval)

#define SAMPLERD_REAL(type, suffix) static const auto real = RealFn<type>(suffix)
#define SAMPLERD_REAL_CONST(type, suffix) static const auto real = RealFn<type>(suffix, true)

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex: acquire after every way of getting it, release before every way of giving it up.

void Mutex::Lock() {
  SAMPLERD_REAL(void (*)(Mutex*), "5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  SAMPLERD_REAL(void (*)(Mutex*), "5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  SAMPLERD_REAL(bool (*)(Mutex*), "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  SAMPLERD_REAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  SAMPLERD_REAL(void (*)(Mutex*), "5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  SAMPLERD_REAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  SAMPLERD_REAL(void (*)(Mutex*, const Condition&), "5Mutex8LockWhenERKNS0_9ConditionE");
  SAMPLERD_GUARDED(cond);
  real(this, guarded);
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  SAMPLERD_REAL(void (*)(Mutex*, const Condition&), "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  SAMPLERD_GUARDED(cond);
  real(this, guarded);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  SAMPLERD_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
                "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  SAMPLERD_GUARDED(cond);
  const bool met = real(this, guarded, timeout);
  __tsan_acquire(this);  // Held on return either way.
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  SAMPLERD_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
                "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  SAMPLERD_GUARDED(cond);
  const bool met = real(this, guarded, deadline);
  __tsan_acquire(this);
  return met;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  SAMPLERD_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
                "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  SAMPLERD_GUARDED(cond);
  const bool met = real(this, guarded, timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  SAMPLERD_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
                "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  SAMPLERD_GUARDED(cond);
  const bool met = real(this, guarded, deadline);
  __tsan_acquire(this);
  return met;
}

// Await gives the mutex up while it waits, and has it again on return.
void Mutex::Await(const Condition& cond) {
  SAMPLERD_REAL(void (*)(Mutex*, const Condition&), "5Mutex5AwaitERKNS0_9ConditionE");
  SAMPLERD_GUARDED(cond);
  __tsan_release(this);
  real(this, guarded);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  SAMPLERD_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
                "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  SAMPLERD_GUARDED(cond);
  __tsan_release(this);
  const bool met = real(this, guarded, timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  SAMPLERD_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
                "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  SAMPLERD_GUARDED(cond);
  __tsan_release(this);
  const bool met = real(this, guarded, deadline);
  __tsan_acquire(this);
  return met;
}

// ---- CondVar: a wait gives `mu` up and gets it back.

void CondVar::Wait(Mutex* mu) {
  SAMPLERD_REAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  SAMPLERD_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
                "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  SAMPLERD_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
                "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

// ---- Notification: the sync object is its flag, which HasBeenNotified (inline, instrumented)
// reads with an acquire load: TSan pairs an atomic acquire on an address with a release
// annotation on the same address.

void Notification::Notify() {
  SAMPLERD_REAL(void (*)(Notification*), "12Notification6NotifyEv");
  __tsan_release(const_cast<std::atomic<bool>*>(&notified_yet_));
  real(this);
}

void Notification::WaitForNotification() const {
  SAMPLERD_REAL_CONST(void (*)(const Notification*), "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  SAMPLERD_REAL_CONST(bool (*)(const Notification*, absl::Duration),
                      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  SAMPLERD_REAL_CONST(bool (*)(const Notification*, absl::Time),
                      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

// ---- BlockingCounter: each DecrementCount releases, Wait acquires them all.

bool BlockingCounter::DecrementCount() {
  SAMPLERD_REAL(bool (*)(BlockingCounter*), "15BlockingCounter14DecrementCountEv");
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  SAMPLERD_REAL(void (*)(BlockingCounter*), "15BlockingCounter4WaitEv");
  real(this);
  __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl

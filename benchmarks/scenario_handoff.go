package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

func (r *runner) handoff(ctx context.Context) (Result, error) {
	cs, closeAll, err := r.clients(ctx, 2)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	name := r.prefix
	// Warm up both clients, and learn how long an uncontended acquire
	// takes: the holder waits a few times that before it releases, so the
	// waiter is blocked in Lock (not still starting its first attempt)
	// when the release happens. That wait is not part of the sample.
	var warm []time.Duration
	for i := range 6 {
		t0 := time.Now()
		if err := r.cycle(ctx, cs[i%2], name); err != nil {
			return Result{}, err
		}
		warm = append(warm, time.Since(t0))
	}
	slices.Sort(warm)
	settle := max(time.Millisecond, 3*warm[len(warm)/2])

	holder, waiter := cs[0], cs[1]
	held, err := r.lock(ctx, holder, name)
	if err != nil {
		return Result{}, err
	}
	defer func() {
		if held != nil {
			_ = r.release(ctx, held)
		}
	}()
	type got struct {
		h   Held
		at  time.Time
		err error
	}
	var samples []time.Duration
	start := time.Now()
	stop := r.stopper(start)
	for stop.next() {
		ch := make(chan got, 1)
		go func() {
			h, err := r.lock(ctx, waiter, name)
			ch <- got{h, time.Now(), err}
		}()
		select {
		case g := <-ch:
			if g.err == nil {
				_ = r.release(ctx, g.h)
				return Result{}, fmt.Errorf("the waiter got %q while it was held", name)
			}
			return Result{}, g.err
		case <-time.After(settle):
		}
		t0 := time.Now()
		if err := r.release(ctx, held); err != nil {
			held = nil
			<-ch
			return Result{}, err
		}
		held = nil
		g := <-ch
		if g.err != nil {
			return Result{}, g.err
		}
		samples = append(samples, g.at.Sub(t0))
		held = g.h
		holder, waiter = waiter, holder
	}
	return newResult(samples, len(samples), time.Since(start)), nil
}

func (r *runner) semaphore(ctx context.Context) (Result, error) {
	cs, closeAll, err := r.clients(ctx, r.p.SemaphoreSize)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	sems := make([]Locker, len(cs))
	for i, c := range cs {
		sc, ok := c.(SemaphoreClient)
		if !ok {
			return Result{}, notApplicable("no semaphores")
		}
		if sems[i], err = sc.Semaphore(ctx, r.p.SemaphoreSize); errors.Is(err, ErrNotApplicable) {
			return Result{}, err
		} else if err != nil {
			return Result{}, fmt.Errorf("semaphore of %d: %w", r.p.SemaphoreSize, err)
		}
	}
	name := r.prefix
	if err := r.cycle(ctx, sems[0], name); err != nil {
		return Result{}, err
	}
	var held []Held
	defer func() {
		for _, h := range held {
			_ = r.release(ctx, h)
		}
	}()
	for _, s := range sems[1:] {
		h, err := r.lock(ctx, s, name)
		if err != nil {
			return Result{}, err
		}
		held = append(held, h)
	}
	last := sems[0]
	var samples []time.Duration
	start := time.Now()
	stop := r.stopper(start)
	for stop.next() {
		t0 := time.Now()
		h, err := r.lock(ctx, last, name)
		if err != nil {
			return Result{}, err
		}
		samples = append(samples, time.Since(t0))
		if err := r.release(ctx, h); err != nil {
			return Result{}, err
		}
	}
	return newResult(samples, len(samples), time.Since(start)), nil
}

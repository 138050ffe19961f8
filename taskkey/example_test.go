package taskkey_test

import (
	"errors"
	"fmt"

	"github.com/tasklease/tasklease/taskkey"
)

func ExampleNew() {
	k, err := taskkey.New("u42", "course_sync")
	if err != nil {
		panic(err)
	}
	fmt.Println(k)
	// Output: u42|course_sync
}

func ExampleParse() {
	k, err := taskkey.Parse("u42|course_sync")
	fmt.Println(k.Subject(), k.Scope(), err)

	// An invalid key is a *taskkey.Error wrapping ErrInvalid.
	_, err = taskkey.Parse("u42|Course")
	var kerr *taskkey.Error
	fmt.Println(errors.Is(err, taskkey.ErrInvalid), errors.As(err, &kerr), kerr.Part)
	fmt.Println(err)
	// Output:
	// u42 course_sync <nil>
	// true true scope
	// invalid task key: scope "Course": must start with a lower-case letter
}
